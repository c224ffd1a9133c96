"""The jobs API's application: every route behind a team's key, errors in OpenAI's shape.

    uvicorn grpoflow.api.app:app_from_env --factory      # what `grpoflow api` runs (GRPOFLOW_API_CONFIG set)

A request's `Authorization: Bearer <key>` is hashed and compared with the keys file's digests (re-read on each
request, so a key added or removed applies at once); no key, or one the file lacks, is 401. The key's team decides
every folder the request reaches (`grpoflow.api.store.TeamStore`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastapi import Depends, FastAPI, Request

from grpoflow.api import fine_tuning, graders, training_jobs
from grpoflow.api.errors import HANDLERS, ApiError
from grpoflow.api.jobs import Settings
from grpoflow.api.store import TeamStore
from grpoflow.core.apikeys import KeysError, read_keys, team_of
from grpoflow.flows.cli.api import API_CONFIG_ENV


async def authenticated(request: Request) -> None:
    """The request's team, from its bearer key; 401 without a key the keys file holds."""
    scheme, _, key = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "no API key: send `Authorization: Bearer <key>`", code="missing_api_key")
    settings: Settings = request.app.state.settings
    try:
        team = team_of(key.strip(), read_keys(settings.keys))
    except KeysError as e:
        raise ApiError(500, str(e), code="keys_file") from None
    if team is None:
        raise ApiError(401, "incorrect API key", code="invalid_api_key")
    request.state.store = TeamStore(settings.output_uri, team)


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(title="grpoflow jobs API", exception_handlers=HANDLERS)
    app.state.settings = settings
    for router in (training_jobs.router, fine_tuning.files, fine_tuning.jobs, graders.router):
        app.include_router(router, dependencies=[Depends(authenticated)])
    return app


def app_from_env() -> FastAPI:
    """The app of the settings `grpoflow api` put in GRPOFLOW_API_CONFIG (JSON: keys, output_uri, deployment,
    project, max_upload_bytes)."""
    config = json.loads(os.environ[API_CONFIG_ENV])
    return create_app(
        Settings(
            keys=Path(config["keys"]),
            output_uri=Path(config["output_uri"]).expanduser().resolve(),
            deployment=config.get("deployment") or "retrain",
            project=Path(config.get("project") or ".").resolve(),
            max_upload_bytes=config.get("max_upload_bytes") or Settings.max_upload_bytes,
        )
    )
