"""The status page: everything an operator needs at a glance, served by the metastore (``/ui``).

Plain server-rendered HTML with an inline SVG chart and inline CSS: no script, no external request, nothing to
build. ``status.collect`` gathers the facts; ``page.render`` draws them; ``mount`` adds the routes.
"""

from shale.web.routes import mount

__all__ = ["mount"]
