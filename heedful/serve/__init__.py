"""``heedful serve``: a local web page and JSON API to explain, compare and evaluate.

>>> from heedful.serve import ServeSettings, create_app     # doctest: +SKIP
>>> app = create_app(ServeSettings(models=["minilm-sentiment"]))   # doctest: +SKIP

Needs the ``serve`` extra (``pip install "heedful[serve]"``: FastAPI, uvicorn). The page is
static (``static/``), talks only to the API, and is served at ``/``; the API's OpenAPI docs are
at ``/docs``. :mod:`heedful.serve.app` has the routes, :mod:`heedful.serve.work` the job
queue, :mod:`heedful.serve.catalog` the models, methods and limits.
"""

from heedful.serve.app import create_app
from heedful.serve.settings import ServeSettings

__all__ = ["ServeSettings", "create_app"]
