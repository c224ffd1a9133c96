"""The promotion gate's section of the job spec (`evaluation.gate`): what a GRPO result's held-out scores must show
before it is published and deployed. Read by `grpoflow.jobs.registry.gate_decision`."""

from pydantic import Field

from grpoflow.core.spec.fields import Section


class GateSpec(Section):
    """The promotion gate: the GRPO result is published and deployed only when it passes; otherwise the run still
    completes, emitting grpoflow.model.rejected with both scores and the reason."""

    min_gain: float | None = Field(
        0.0,
        description="Least held-out gain required, after minus before, in the metric's units (e.g. 0.05 for five "
        "points of a 0-1 reward); 0 or more also needs the model to beat the one GRPO started from (a tie is no "
        "gain), so by default a model no better than its start is never published or deployed. A negative value "
        "tolerates that much of a loss; null turns the gate off (and is what the default means with holdout 0).",
    )
    beat_deployed: bool = Field(
        False,
        description="Also require a held-out score at least the one of the version the serving name (deploy.name) "
        "serves now; passes when it serves nothing scored yet.",
    )
    significant: bool = Field(
        False,
        description="Also require the gain to be more than chance: the lower bound of its interval "
        "(evaluation.confidence, a paired bootstrap over the held-out prompts) must exceed min_gain, so that a gain "
        "of one prompt in forty is not promoted. Needs min_gain and a confidence.",
    )
    approval: bool = Field(
        False,
        description="Ask a person: after the evaluation (and the checks above), the flow run pauses until someone "
        "resumes it in the Prefect UI with approve (yes or no) and a note; not approved: neither published nor "
        "deployed. Needs a Prefect server with its UI (a deployment run, or grpoflow run with PREFECT_API_URL set).",
    )
    approval_timeout_hours: float = Field(
        24.0,
        gt=0,
        le=24 * 30,
        description="With approval: no decision within this many hours means not promoted "
        "(grpoflow.model.rejected, reason timeout).",
    )
