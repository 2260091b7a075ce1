"""The HTTP side of the broker's port: what the admin client and health probes speak.

protocol.py   HTTP/1.1 (h11) over a connection the listener handed over, plain or TLS (ssl.MemoryBIO)
tls.py        the local CA and server certificate under <data-dir>/tls/, or the user's own certificate
app.py        GET /health, /metrics, /explorer (explorer/), everything else to the management API on a worker pool
admin.py      the Service Bus ATOM management API: paths, dispatch table, SAS authorization, errors
atom.py       ATOM/XML documents <-> entity descriptions and rules (the hand-written Service Bus mapping)
xmlvalues.py  scalar values in that XML: ISO-8601 durations, booleans, timestamps, typed rule values
explorer/     the Service Bus Explorer in the browser (server-rendered pages, SVG charts)
"""
