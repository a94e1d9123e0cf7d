from shale.cli import main

main()
