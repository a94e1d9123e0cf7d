import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import java.util.HashMap;
import java.util.Map;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

/**
 * Apache Iceberg's REST catalog server (org.apache.iceberg.rest.RESTCatalogServer, iceberg-open-api's test
 * fixtures) as its main method runs it, bound to one address. RESTCatalogServer.start builds its Jetty server with
 * new Server(port), which listens on every interface and takes no host; this runs the same pieces (its
 * environment translation RCKUtils.environmentCatalogConfig, its RESTServerCatalogAdapter over the backend catalog,
 * iceberg-core's RESTCatalogServlet) on a connector bound to rest.host (default 127.0.0.1). The backend catalog is
 * built without a Hadoop Configuration (the JDBC catalog with S3FileIO needs none). The properties are never
 * logged: a warehouse's credentials come from the process environment (AWS_ACCESS_KEY_ID, ...), not properties.
 */
public final class LoopbackRESTCatalogServer {
  public static void main(String[] args) throws Exception {
    Class<?> rck = Class.forName("org.apache.iceberg.rest.RCKUtils");
    Method env = rck.getDeclaredMethod("environmentCatalogConfig");
    env.setAccessible(true);
    @SuppressWarnings("unchecked")
    Map<String, String> properties = new HashMap<>((Map<String, String>) env.invoke(null));
    properties.putIfAbsent("catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog");
    properties.putIfAbsent("jdbc.schema-version", "V1");
    if (!properties.containsKey("uri") || !properties.containsKey("warehouse")) {
      throw new IllegalArgumentException("set CATALOG_URI and CATALOG_WAREHOUSE");
    }
    String host = properties.getOrDefault("rest.host", "127.0.0.1");
    int port = Integer.parseInt(properties.getOrDefault("rest.port", "8181"));
    String name = properties.getOrDefault("catalog.name", "rest_backend");
    Catalog catalog = CatalogUtil.buildIcebergCatalog(name, properties, null);

    Class<?> contextClass = Class.forName("org.apache.iceberg.rest.RESTCatalogServer$CatalogContext");
    Constructor<?> newContext = contextClass.getDeclaredConstructor(Catalog.class, Map.class);
    newContext.setAccessible(true);
    Object context = newContext.newInstance(catalog, properties);
    Constructor<?> newAdapter =
        Class.forName("org.apache.iceberg.rest.RESTServerCatalogAdapter").getDeclaredConstructor(contextClass);
    newAdapter.setAccessible(true);
    RESTCatalogServlet servlet =
        new RESTCatalogServlet((org.apache.iceberg.rest.RESTCatalogAdapter) newAdapter.newInstance(context));

    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    handler.addServlet(new ServletHolder(servlet), "/*");
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(host);
    connector.setPort(port);
    server.addConnector(connector);
    server.setHandler(handler);
    server.start();
    System.err.println("REST catalog " + name + " listening on " + host + ":" + connector.getLocalPort());
    server.join();
  }
}
