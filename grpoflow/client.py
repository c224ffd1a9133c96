"""A small Python client of the jobs API's training jobs (Veri's API, `grpoflow api`); it imports only httpx2.

    from grpoflow.client import Client

    client = Client("http://127.0.0.1:8600", api_key="gf-...")
    job = client.training_jobs.create({"name": "arith", "base_model": "builtin:tiny", "dataset": "file-...",
                                       "rewards": [{"name": "exact_answer"}]})
    client.training_jobs.get(job["id"])["status"]            # queued, running, ..., succeeded
    client.training_jobs.metrics(job["id"], keys=["reward", "loss"])
    client.training_jobs.model(job["id"])

An error answer raises `ApiError`, with the status, the message and (for a rejected spec) every problem.
"""

from __future__ import annotations

import httpx2


class ApiError(Exception):
    """The API answered with an error: `status`, `message`, `param`, `code` and `problems` (each {param, message})."""

    def __init__(self, status: int, error: dict):
        self.status, self.message = status, error.get("message") or f"HTTP {status}"
        self.param, self.code, self.problems = error.get("param"), error.get("code"), error.get("problems") or []
        super().__init__(f"{status}: {self.message}")


class TrainingJobs:
    """`/v1/training_jobs`: create, get, list, metrics, events, model, cancel, pause, resume."""

    def __init__(self, http: httpx2.Client):
        self._http = http

    def _call(self, method: str, path: str, **kwargs):
        response = self._http.request(method, f"/v1/training_jobs{path}", **kwargs)
        if response.status_code >= 400:
            try:
                error = response.json().get("error") or {}
            except ValueError:
                error = {"message": response.text}
            raise ApiError(response.status_code, error)
        return response.json()

    def create(self, spec: dict) -> dict:
        """Submits a job spec (a dict, as the YAML spec reads); returns the job: {id, status, created_at, ...}."""
        return self._call("POST", "", json=spec)

    def get(self, job_id: str) -> dict:
        return self._call("GET", f"/{job_id}")

    def list(self) -> list[dict]:
        return self._call("GET", "")["data"]

    def metrics(self, job_id: str, keys: list[str] | None = None) -> list[dict]:
        """The job's metric series, one {step, values} a step; `keys` picks the values (default: all)."""
        params = {"keys": ",".join(keys)} if keys else None
        return self._call("GET", f"/{job_id}/metrics", params=params)["metrics"]

    def events(self, job_id: str) -> list[dict]:
        return self._call("GET", f"/{job_id}/events")["data"]

    def model(self, job_id: str) -> dict:
        """The trained artifact: {artifact_type, files, merged_files}."""
        return self._call("GET", f"/{job_id}/model")

    def cancel(self, job_id: str) -> dict:
        return self._call("POST", f"/{job_id}/cancel")

    def pause(self, job_id: str) -> dict:
        """Pauses a running job: its run stops, its checkpoints stay; status `paused` (ApiError 409 if not running)."""
        return self._call("POST", f"/{job_id}/pause")

    def resume(self, job_id: str) -> dict:
        """Resumes a paused job from its last checkpoint (ApiError 409 `still_stopping` until its run has ended)."""
        return self._call("POST", f"/{job_id}/resume")


class Client:
    """The jobs API at `base_url` (e.g. http://127.0.0.1:8600), with a team's key.

    Args:
        base_url (`str`): where `grpoflow api` serves.
        api_key (`str`): a key `grpoflow api keys add` printed.
        timeout (`float`, *optional*, defaults to `30.0`): seconds a request may take.
    """

    def __init__(self, base_url: str, api_key: str, timeout: float = 30.0):
        headers = {"Authorization": f"Bearer {api_key}"}
        self._http = httpx2.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self.training_jobs = TrainingJobs(self._http)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
