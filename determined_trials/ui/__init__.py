"""The local web dashboard, ``det-trials ui``: a Starlette app over a run folder's store (experiments, trials,
charts, checkpoints, logs; pause, continue and kill) and the JSON API its page uses (docs/ui.md).

Owns the app and its routes (``_app``), who may ask (``_auth``: Host and Origin checks, the token as bearer or
cookie), the JSON the API answers (``_data``; an optuna study's parameter importances: ``_importances``; where
a trial or experiment came from, for the links back: ``_lineage``), downsampling series (``_downsample``), the
token file and serving with uvicorn (``_server``), noticing a run folder deleted or replaced under it
(``_watch``) and the page's files (``static/``).

``core`` and ``core.store`` for reads, ``experiment`` for the three actions. Only ``cli`` imports it, and
only when ``det-trials ui`` runs (starlette and uvicorn are the ``ui`` extra).

May import: errors, _format, config, core, core.store, experiment, searcher
"""

from determined_trials.ui._app import UiSettings, create_app
from determined_trials.ui._server import MIN_TOKEN_LENGTH, TOKEN_FILE, is_loopback, load_or_create_token, serve

__all__ = ["MIN_TOKEN_LENGTH", "TOKEN_FILE", "UiSettings", "create_app", "is_loopback", "load_or_create_token",
           "serve"]
