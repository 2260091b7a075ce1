"""The Service Bus Explorer in the browser, at ``/explorer`` on the broker's port (plain HTTP and HTTPS).

Server-side rendered pages (Jinja2 templates, autoescaped) with one small script for the auto-refresh and the
confirmations, and charts drawn as SVG on the server: the package carries everything it serves, nothing is fetched
from elsewhere at run time.

signin.py    sign-in with the namespace's SAS key, the session cookie (a SAS token), CSRF tokens
readings.py  what the pages show, read through the namespace's operations (peeks never lock)
actions.py   what the forms change, through the same operations (send, resubmit, purge, cancel, management)
history.py   in/out per second per partition, from the counters /metrics exports, sampled while viewed
charts.py    the heat strip and sparklines (SVG)
pages.py     the routes table, requests to responses, templates/ and static/
"""

from .pages import Explorer

__all__ = ["Explorer"]
