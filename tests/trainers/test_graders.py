"""OpenAI grader objects as rewards: checked at validate with the openai package's types (every problem with its
path), each type scored as OpenAI's grader guide defines it, text similarity agreeing with the libraries that define
each metric, model graders against an OpenAI-compatible endpoint on loopback, python graders in their own process."""

import asyncio
import doctest
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from grpoflow.core import formula
from grpoflow.core import graders as checks
from grpoflow.core.spec import SpecError, load_spec
from grpoflow.core.trust import command_line
from grpoflow.trainers.graders import endpoint, reward, similarity, templates
from grpoflow.trainers.graders.reward import get_grader_reward
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.dry_run import call_reward
from tests.conftest import cli, write_jsonl
from tests.hostile_server import HostileServer, timed

OUTPUT, ANSWER = "{{ sample.output_text }}", "{{ item.answer }}"


def string_check(operation: str, name: str = "check") -> dict:
    return {"type": "string_check", "name": name, "input": OUTPUT, "reference": ANSWER, "operation": operation}


def text_similarity(metric: str, name: str = "similar") -> dict:
    return {"type": "text_similarity", "name": name, "input": OUTPUT, "reference": ANSWER, "evaluation_metric": metric}


def grade(grader: dict, completions: list, answers: list, **kwargs) -> list:
    built = build_reward(grader["name"], grader=grader, kwargs=kwargs)
    return call_reward(built, ["q"] * len(completions), completions, [[]] * len(completions), {"answer": answers})


@pytest.mark.parametrize("module", [checks, endpoint, formula, reward, similarity, templates])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


# --- checked at validate --------------------------------------------------------------------------------------------

PYTHON_SOURCE = "def grade(sample, item):\n    return float(sample['output_text'] == item['answer'])\n"
MALFORMED = [
    # a string_check operation OpenAI's type does not have
    ({**string_check("eq"), "operation": "equals"}, "rewards[0].grader.operation: Input should be 'eq', 'ne'"),
    # a required field missing, named by its path
    ({k: v for k, v in string_check("eq").items() if k != "reference"}, "rewards[0].grader.reference: required"),
    # a typo'd field is refused, not ignored (the openai types keep extras)
    ({**string_check("eq"), "refrence": "x"}, "rewards[0].grader.refrence: unknown field"),
    # an unknown type
    ({"type": "regex_check", "name": "r"}, "rewards[0].grader.type: 'regex_check' is not a grader type"),
    # an unknown metric
    (text_similarity("bleurt"), "rewards[0].grader.evaluation_metric: Input should be 'cosine'"),
    # a template namespace OpenAI does not have
    ({**string_check("eq"), "input": "{{ output.text }}"}, "rewards[0].grader.input: {{ output.text }} must be"),
    # a sample field grpoflow cannot fill in
    ({**string_check("eq"), "input": "{{ sample.output_tools }}"}, "sample.output_tools is not available"),
    # a python grader that is not Python, and one without grade()
    ({"type": "python", "name": "p", "source": "def grade(s, i)\n"}, "rewards[0].grader.source: is not valid Python"),
    ({"type": "python", "name": "p", "source": "x = 1"}, "defines no top-level grade(sample, item) function"),
    # a score_model range the wrong way round
    (
        {
            "type": "score_model",
            "name": "s",
            "model": "m",
            "input": [{"role": "user", "content": "x"}],
            "range": [1, 0],
        },
        "rewards[0].grader.range: must be [low, high] with low < high",
    ),
    # passing labels that are not labels
    (
        {
            "type": "label_model",
            "name": "l",
            "model": "m",
            "input": [{"role": "user", "content": "x"}],
            "labels": ["good", "bad"],
            "passing_labels": ["great"],
        },
        "rewards[0].grader.passing_labels: 'great' not among labels",
    ),
    # a message role OpenAI's type does not have
    (
        {"type": "score_model", "name": "s", "model": "m", "input": [{"role": "judge", "content": "x"}]},
        "rewards[0].grader.input[0].role: Input should be 'user'",
    ),
    # multi: a formula naming no sub-grader, a formula calling what is not allowed, a nested multi
    (
        {"type": "multi", "name": "m", "calculate_output": "a + b", "graders": {"a": string_check("eq", "a")}},
        "rewards[0].grader.calculate_output: 'b' is not a sub-grader's name (the sub-graders: a)",
    ),
    (
        {"type": "multi", "name": "m", "calculate_output": "__import__('os')", "graders": {"a": string_check("eq")}},
        "rewards[0].grader.calculate_output: __import__(...) is not allowed",
    ),
    (
        {"type": "multi", "name": "m", "calculate_output": "a", "graders": {"a": {"type": "multi", "name": "a"}}},
        "rewards[0].grader.graders.a.type: 'multi' is not a grader type",
    ),
    # a sub-grader's own problem, with its path
    (
        {
            "type": "multi",
            "name": "m",
            "calculate_output": "a",
            "graders": {"a": {**string_check("eq"), "operation": 1}},
        },
        "rewards[0].grader.graders.a.operation:",
    ),
    # not a mapping at all
    ("string_check", "rewards[0].grader: must be an OpenAI grader object"),
    # a column TRL never hands a reward (it was always empty, silently)
    (
        {**string_check("eq"), "reference": "{{ item.completion }}"},
        "rewards[0].grader.reference: item.completion is always empty: TRL hands rewards every dataset column but",
    ),
]


@pytest.mark.parametrize("grader, expect", MALFORMED)
def test_a_malformed_grader_is_rejected_naming_its_field(grader, expect, tmp_path):
    spec = {"name": "g", "base_model": "builtin:tiny", "dataset": {"uri": "d.jsonl"}, "rewards": [{"grader": grader}]}
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert any(expect in problem for problem in caught.value.problems), caught.value.problems


@pytest.mark.parametrize(
    "entry, expect",
    [
        # model graders need the endpoint; its key only by variable name; no credentials in its URL
        (
            {
                "grader": {
                    "type": "label_model",
                    "name": "l",
                    "model": "m",
                    "input": [],
                    "labels": ["a"],
                    "passing_labels": ["a"],
                }
            },
            "rewards[0].kwargs.base_url: required",
        ),
        (
            {"grader": text_similarity("cosine"), "kwargs": {"base_url": "http://u:p@127.0.0.1/v1"}},
            "holds credentials",
        ),
        ({"grader": text_similarity("cosine"), "kwargs": {"base_url": "http://169.254.169.254/v1"}}, "link-local"),
        # the metadata address through NAT64's prefix, as a score_model endpoint
        (
            {
                "grader": {
                    "type": "score_model",
                    "name": "s",
                    "model": "m",
                    "input": [{"role": "user", "content": OUTPUT}],
                },
                "kwargs": {"base_url": "http://[64:ff9b::a9fe:a9fe]/v1"},
            },
            "carries 169.254.169.254, a link-local address",
        ),
        ({"grader": string_check("eq"), "kwargs": {"timeout": 3}}, "a string_check grader takes no kwargs"),
        (
            {"grader": {"type": "python", "name": "p", "source": PYTHON_SOURCE}, "kwargs": {"memory_mb": 1}},
            "rewards[0].kwargs.memory_mb: must be an integer of MiB from 64 to the operator's GRPOFLOW_SANDBOX_MEM",
        ),
        # one name: the grader's
        ({"grader": string_check("eq", "exact"), "name": "other"}, "rewards[0].name: a grader's reward is named by"),
        ({"grader": string_check("eq"), "function": "m:f"}, "rewards[0].function: a grader entry is the grader"),
    ],
)
def test_grader_entry_rules(entry, expect):
    spec = {"name": "g", "base_model": "builtin:tiny", "dataset": {"uri": "d.jsonl"}, "rewards": [entry]}
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert any(expect in problem for problem in caught.value.problems), caught.value.problems


def test_a_pass_threshold_of_an_evals_grader_is_kept_unread():
    grader = {**text_similarity("bleu"), "pass_threshold": 0.6}  # as OpenAI's Evals API writes it
    assert checks.grader_problems(grader) == []
    assert checks.grader_problems({**grader, "pass_threshold": "high"}) == [
        ("grader.pass_threshold", "must be a number, got 'high'")
    ]


def test_the_grader_name_is_the_reward_name_and_the_object_is_kept_as_given():
    grader = string_check("ilike", "contains_answer")
    spec, _ = load_spec(
        {
            "name": "g",
            "base_model": "builtin:tiny",
            "dataset": {"uri": "d.jsonl"},
            "rewards": [{"grader": grader, "weight": 2}],
        }
    )
    assert spec.rewards[0].name == "contains_answer" and spec.rewards[0].grader == grader


def grader_spec(tmp_path, rows: list[dict]) -> Path:
    """A spec file of one string_check grader over a dataset of `rows`."""
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    spec = {"name": "g", "base_model": "builtin:tiny", "dataset": {"uri": str(data)}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec | {"rewards": [{"grader": string_check("eq")}]}))
    return tmp_path / "s.yaml"


def test_validate_names_a_template_column_the_dataset_lacks(tmp_path):
    code, _, err = cli("validate", grader_spec(tmp_path, [{"prompt": "2+2?", "reference_answer": "4"}] * 4))
    assert code == 2
    assert "column 'answer' (needed by reward 'check') not found; the columns are 'prompt', 'reference_answer'" in err


# --- each type's scores ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "operation, completions, answers, expect",
    [
        ("eq", ["4", "4 ", "5"], ["4", "4", "4"], [1.0, 0.0, 0.0]),  # exact, whitespace counts
        ("ne", ["4", "5"], ["4", "4"], [0.0, 1.0]),
        ("like", ["It is 42.", "it is FORTY", "4"], ["42", "forty", "42"], [1.0, 0.0, 0.0]),  # contains, case counts
        ("ilike", ["It is 42.", "it is FORTY", "4"], ["42", "forty", "42"], [1.0, 1.0, 0.0]),  # contains, any case
    ],
)
def test_string_check(operation, completions, answers, expect):
    assert grade(string_check(operation), completions, answers) == expect


def test_chat_completions_and_json_outputs_fill_the_templates():
    grader = {**string_check("eq"), "input": "{{ sample.output_json.answer }}"}
    chat = [[{"role": "assistant", "content": '{"answer": "4"}'}], [{"role": "assistant", "content": "not json"}]]
    assert grade(grader, chat, ["4", ""]) == [1.0, 1.0]  # no JSON: the path fills in as empty


def reference_scores(metric: str, output: str, reference: str) -> float:
    """The metric as its own library computes it, called here directly."""
    if metric == "bleu":
        import sacrebleu

        return sacrebleu.sentence_bleu(output, [reference]).score / 100
    if metric == "gleu":
        from nltk.tokenize import word_tokenize
        from nltk.translate.gleu_score import sentence_gleu

        return sentence_gleu([word_tokenize(reference, preserve_line=True)], word_tokenize(output, preserve_line=True))
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return fuzz.WRatio(output, reference) / 100
    from rouge_score import rouge_scorer

    kind = "rouge" + metric.removeprefix("rouge_").upper()
    return rouge_scorer.RougeScorer([kind]).score(reference, output)[kind].fmeasure


PAIRS = [
    ("the cat sat on the mat", "the cat sat on the mat"),
    ("the cat sat on the mat", "a cat was sitting on the mat"),
    ("The quick brown fox jumps over the lazy dog", "the quick brown fox jumped over a lazy dog"),
    ("42", "forty-two"),
    ("", "something"),
    ("Paris is the capital of France.", "The capital of France is Paris."),
]
METRICS = ["fuzzy_match", "bleu", "gleu", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"]


@pytest.mark.parametrize("metric", METRICS)
def test_text_similarity_agrees_with_the_library_defining_each_metric(metric):
    outputs, references = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    scores = grade(text_similarity(metric), outputs, references)
    expected = [reference_scores(metric, o, r) for o, r in PAIRS]
    assert scores == pytest.approx(expected, abs=1e-12)
    assert scores[0] == pytest.approx(1.0) and scores[4] == 0.0  # identical: 1; nothing written: 0
    assert all(0.0 <= s <= 1.0 for s in scores)


@pytest.mark.parametrize(
    "metric, output, reference, expect",
    [
        ("rouge_1", "the cat sat", "the cat sat down", 2 * 1.0 * 0.75 / 1.75),  # P 3/3, R 3/4: F1 by hand
        ("rouge_2", "the cat sat", "the cat sat down", 2 * 1.0 * (2 / 3) / (1 + 2 / 3)),  # P 2/2, R 2/3
        ("bleu", "a b c d", "a b c d", 1.0),
        ("fuzzy_match", "abc", "xyz", 0.0),
        # GLEU = min(n-gram precision, recall) over 1- to 4-grams of NLTK's tokens, each counted by hand:
        ("gleu", "The capital is Tokyo.", "Tokyo", 1 / 14),  # 1 match of 5+4+3+2 answer n-grams (0 on whitespace)
        ("gleu", "Tokyo", "The capital is Tokyo.", 1 / 14),  # the same match, recall now the smaller
        ("gleu", "Tokyo.", "Tokyo", 1 / 3),  # `Tokyo` `.`: 3 n-grams, 1 matches
        ("gleu", "the cat sat", "the cat sat down", 6 / 10),  # all 6 answer n-grams match, of the reference's 10
        ("gleu", "Don't stop.", "Do not stop.", 4 / 10),  # Do n't stop . : Do, stop, ., "stop ." match
        ("gleu", "tokyo", "Tokyo", 0.0),  # case counts, as in BLEU
    ],
)
def test_text_similarity_known_values(metric, output, reference, expect):
    assert grade(text_similarity(metric), [output], [reference]) == pytest.approx([expect])


def test_meteor_needs_wordnet_and_says_so_or_agrees_with_nltk():
    problem = checks.metric_problem("meteor")
    if problem is not None:
        assert "python -m nltk.downloader wordnet" in problem
        with pytest.raises(SpecError, match="meteor matches synonyms through NLTK's WordNet"):
            load_spec(
                {
                    "name": "g",
                    "base_model": "builtin:tiny",
                    "dataset": {"uri": "d.jsonl"},
                    "rewards": [{"grader": text_similarity("meteor")}],
                }
            )
        return
    from nltk.translate.meteor_score import meteor_score

    scores = grade(text_similarity("meteor"), [p[0] for p in PAIRS], [p[1] for p in PAIRS])
    assert scores == pytest.approx([meteor_score([r.split()], o.split()) for o, r in PAIRS])


# --- python graders: a process of their own -------------------------------------------------------------------------


def python_grader(source: str) -> dict:
    return {"type": "python", "name": "py", "source": source}


def test_a_python_grader_scores_in_its_own_process_without_the_jobs_secrets(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_in_the_trainer")
    source = (
        "import os\n"
        "def grade(sample, item):\n"
        "    print('chatty grader')\n"  # its prints must not corrupt the scores
        "    os.write(1, b'[1, 2]')\n"  # nor what it writes on fd 1 itself
        "    os.system('echo from a process it starts')\n"
        "    if item['answer'] == 'env':\n"
        "        return float(len(os.environ.get('HF_TOKEN', '')))\n"
        "    if item['answer'] == 'pid':\n"
        "        return float(os.getpid())\n"
        "    return 1.0 if sample['output_text'].strip() == item['answer'] else 0.25\n"
    )
    import os

    scores = grade(python_grader(source), ["4", "5", "x", "x"], ["4", "4", "env", "pid"])
    assert scores[:3] == [1.0, 0.25, 0.0]  # no HF_TOKEN in its environment
    assert scores[3] != float(os.getpid())


@pytest.mark.parametrize(
    "body, error",
    [
        ("    raise ValueError('cannot parse')", "ValueError: cannot parse"),
        ("    while True:\n        pass", "did not return within 1 s"),
        ("    return 'high'", "grade() returned str"),
        ("    return float('nan')", "expected a finite number"),
        ("    import os\n    os._exit(3)", "the grader's process ended with exit code 3"),
    ],
)
def test_a_python_grader_that_fails_scores_none_and_the_trainer_goes_on(body, error):
    source = f"def grade(sample, item):\n    if item['answer'] == 'ok':\n        return 1.0\n{body}\n"
    built = build_reward("py", grader=python_grader(source), kwargs={"timeout": 1})
    scores = call_reward(built, ["q"] * 2, ["a", "b"], [[]] * 2, {"answer": ["bad", "ok"]})
    assert scores[0] is None and error in built.__wrapped__.errors[0]
    if "exit code" not in error:  # the process survived the bad row: the next one is scored
        assert scores[1] == 1.0


# --- model graders against an OpenAI-compatible endpoint ------------------------------------------------------------


class Endpoint:
    """An OpenAI-compatible endpoint on loopback: chat completions answered by `answer(body)`, embeddings a
    bag-of-letters vector of each input; every request recorded."""

    def __init__(self, answer):
        self.requests = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                endpoint.requests.append({"path": self.path, "headers": self.headers, "body": body})  # any case
                if self.path.endswith("/embeddings"):
                    vectors = [[t.lower().count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for t in body["input"]]
                    reply = {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]}
                else:
                    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer(body)}}]}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def openai_endpoint():
    made = []

    def make(answer):
        made.append(Endpoint(answer))
        return made[-1]

    yield make
    for e in made:
        e.server.shutdown()
        e.server.server_close()


def judged(body: dict) -> str:
    """The judge's answer: high when the graded answer (after 'Answer:') is the reference (after 'Reference:')."""
    text = body["messages"][0]["content"]
    answer, reference = text.split("Answer:")[1].split("Reference:")
    return "9" if answer.strip() == reference.strip() else "2 (it is wrong)"


SCORE_MODEL = {
    "type": "score_model",
    "name": "judged",
    "model": "gpt-4o-2024-08-06",
    "input": [{"role": "user", "content": "Answer: {{ sample.output_text }} Reference: {{ item.answer }}"}],
    "range": [0, 10],
    "sampling_params": {"temperature": 0.2, "seed": 7, "max_completions_tokens": 16},
}


def test_score_model_asks_the_endpoint_and_keeps_the_number_in_range(openai_endpoint, monkeypatch):
    served = openai_endpoint(judged)
    monkeypatch.setenv("GRADER_KEY", "sk-grader-key-1234")
    kwargs = {"base_url": served.base_url, "api_key_env": "GRADER_KEY", "model": "local-judge"}
    assert grade(SCORE_MODEL, ["4", "5"], ["4", "4"], **kwargs) == [9.0, 2.0]
    body = served.requests[0]["body"]
    assert body["model"] == "local-judge" and body["temperature"] == 0.2 and body["seed"] == 7
    assert body["max_tokens"] == 16
    assert body["messages"][-1]["content"] == "Answer with one number from 0 to 10 and nothing else."
    assert served.requests[0]["headers"]["Authorization"] == "Bearer sk-grader-key-1234"
    over = openai_endpoint(lambda body: "15")
    assert grade(SCORE_MODEL, ["4"], ["4"], base_url=over.base_url) == [10.0]  # clipped to the range


def test_label_model_passes_on_a_passing_label(openai_endpoint):
    served = openai_endpoint(lambda body: "Correct." if "Answer: 4 " in body["messages"][0]["content"] else "wrong")
    grader = {
        "type": "label_model",
        "name": "labelled",
        "model": "gpt-4o-mini",
        "input": [
            {"role": "system", "content": "Grade."},
            {"role": "user", "content": "Answer: {{ sample.output_text }} "},
        ],
        "labels": ["correct", "wrong"],
        "passing_labels": ["correct"],
    }
    grader["input"].reverse()  # the user message first, which the stub reads
    unparseable = openai_endpoint(lambda body: "no idea")
    assert grade(grader, ["4", "5"], ["4", "4"], base_url=served.base_url) == [1.0, 0.0]
    assert served.requests[0]["body"]["messages"][-1]["content"].endswith("correct, wrong.")
    assert grade(grader, ["4"], ["4"], base_url=unparseable.base_url) == [None]


def test_cosine_embeds_both_texts(openai_endpoint):
    served = openai_endpoint(lambda body: "")
    scores = grade(text_similarity("cosine"), ["abc", "abc"], ["abc", "xyz"], base_url=served.base_url)
    assert scores == pytest.approx([1.0, 0.0])
    assert served.requests[0]["body"]["model"] == "text-embedding-3-large"


@pytest.mark.parametrize("grader", [SCORE_MODEL, text_similarity("cosine")], ids=["score_model", "cosine"])
@pytest.mark.parametrize("resolved", ["169.254.169.254", "2002:a9fe:a9fe::"])
def test_an_endpoint_name_resolving_to_link_local_is_refused_when_built(monkeypatch, grader, resolved):
    # The spec's check reads the URL only; building the reward looks the name up, every address it resolves to.
    found = [("127.0.0.1", 0), (resolved, 0, 0, 0) if ":" in resolved else (resolved, 0)]
    monkeypatch.setattr("socket.getaddrinfo", lambda host, port: [(None, None, None, "", a) for a in found])
    assert checks.grader_problems(grader, {"base_url": "http://grader.example/v1"}) == []
    with pytest.raises(ValueError, match=rf"^kwargs.base_url: grader.example resolves to {resolved}.*link-local"):
        get_grader_reward(grader, base_url="http://grader.example/v1")


def test_a_trickling_embeddings_endpoint_ends_at_its_timeout():
    cosine = text_similarity("cosine")
    with HostileServer("trickle", every_s=0.3) as server:
        error, seconds = timed(lambda: grade(cosine, ["a"], ["a"], base_url=server.base_url, timeout=0.5, retries=0))
    assert "(ReadTimeout: no complete reply within 0.5 s, the request's whole timeout) after 1 attempts" in str(error)
    assert seconds < 1.5  # the whole answer would take ~40 s


def test_an_embeddings_reply_without_vectors_names_the_endpoint():
    # A chat completion where the embeddings belong: what it sent, not a traceback.
    with HostileServer("trickle", every_s=0.0) as server, command_line():  # the user's own spec: what it sent
        error, _ = timed(lambda: grade(text_similarity("cosine"), ["a"], ["a"], base_url=server.base_url, retries=0))
    assert str(error).startswith(f'the endpoint at {server.base_url} sent no data[].embedding: {{"choices"')


def test_a_huge_score_model_reply_is_refused_naming_the_cap(monkeypatch):
    monkeypatch.setenv("GRPOFLOW_HTTP_MAX_RESPONSE_MB", "1")
    with HostileServer("huge", size=20_000_000) as server:
        error, _ = timed(lambda: grade(SCORE_MODEL, ["4"], ["4"], base_url=server.base_url, retries=2))
    assert str(error) == (
        f"the judge at {server.base_url} sent a reply over 1 MB, the cap GRPOFLOW_HTTP_MAX_RESPONSE_MB sets; not read "
        "further"
    )
    assert server.requests == 1  # the same request would bring the same reply: not retried


# --- multi ----------------------------------------------------------------------------------------------------------


def test_multi_combines_named_sub_graders_with_its_formula():
    grader = {
        "type": "multi",
        "name": "blend",
        "graders": {
            "exact": string_check("eq", "exact"),
            "fuzzy": text_similarity("fuzzy_match", "fuzzy"),
            "py": python_grader("def grade(sample, item):\n    return 1 / len(sample['output_text'])\n"),
        },
        "calculate_output": "0.5 * exact + 0.5 * fuzzy ^ 2 + min(py, 0)",
    }
    fuzzy = similarity.similarity("fuzzy_match", "forty two", "forty-two")
    scores = grade(grader, ["4", "forty two", ""], ["4", "forty-two", "x"])
    assert scores[:2] == pytest.approx([1.0, 0.5 * fuzzy**2])
    assert scores[2] is None  # the python sub-grader divided by zero: the whole score does not apply


def test_a_single_sub_grader_in_the_openai_packages_form_is_named_by_its_name():
    grader = {"type": "multi", "name": "m", "graders": string_check("eq", "exact"), "calculate_output": "2 * exact"}
    assert grade(grader, ["4", "5"], ["4", "4"]) == [2.0, 0.0]


@pytest.mark.parametrize(
    "text, scores, expect",
    [
        ("a + b * 2", {"a": 1, "b": 0.5}, 2.0),
        ("2 ^ 3 ^ 2", {}, 512.0),  # ^ is a power, right-associative as **
        ("max(a, b) - abs(-b)", {"a": 0.2, "b": 0.7}, 0.0),
        ("floor(a * 10) / 10 + ceil(b) + sqrt(4) + log(exp(1))", {"a": 0.27, "b": 0.1}, 0.2 + 1 + 2 + 1),
    ],
)
def test_formula(text, scores, expect):
    assert formula.evaluate(formula.parse_formula(text, list(scores)), scores) == pytest.approx(expect)


@pytest.mark.parametrize(
    "text", ["open('x')", "a.__class__", "[a for a in b]", "a if b else 1", "'a' * 3", "a // b", "a < b", "lambda: 1"]
)
def test_a_formula_outside_the_grammar_is_refused(text):
    with pytest.raises(formula.FormulaError):
        formula.parse_formula(text, ["a", "b"])


def test_the_reward_is_async_and_names_its_columns():
    built = get_grader_reward(
        {
            "type": "multi",
            "name": "m",
            "calculate_output": "a + b",
            "graders": {
                "a": string_check("eq", "a"),
                "b": {**string_check("eq", "b"), "reference": "{{ item.meta.x }}"},
            },
        },
        prompt_column="messages",
    )
    from grpoflow.trainers.rewards.build import reward_columns

    assert asyncio.iscoroutinefunction(built) and reward_columns(built) == ["answer", "meta"]
    # the prompt column is the item's too, under its own name
    echo = get_grader_reward({**string_check("eq"), "reference": "{{ item.messages[0].content }}"}, "messages")
    got = asyncio.run(echo(["hi", "ho"], prompts=[[{"role": "user", "content": "hi"}]] * 2))
    assert got == [1.0, 0.0] and not math.isnan(got[1])


# --- grpoflow graders run -------------------------------------------------------------------------------------------


@pytest.fixture
def rft_spec(tmp_path):
    """A spec over an OpenAI-format chat dataset with a grader, a built-in and a function reward."""
    rows = [
        {
            "messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
            "answer": str(2 * i),
            "completion": str(2 * i),
        }
        for i in range(6)
    ]
    data = write_jsonl(tmp_path / "rft.jsonl", rows)
    spec = {
        "name": "rft",
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(data), "prompt_column": "messages"},
        "rewards": [
            {"grader": string_check("eq", "exact_grader"), "weight": 2.0},
            {"name": "length_penalty", "kwargs": {"max_chars": 1}},
            {"function": "grpoflow.examples.rewards.arithmetic:close_answer_reward", "weight": 0.5},
        ],
    }
    path = tmp_path / "rft.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_graders_run_scores_every_reward_as_training_would(rft_spec, tmp_path):
    completions = write_jsonl(
        tmp_path / "c.jsonl",
        [{"row": 1, "completion": "2"}, {"row": 3, "completion": "7"}, {"row": 5, "completion": "ten"}],
    )
    code, out, err = cli("graders", "run", rft_spec, "--completions", completions, "--json")
    assert code == 0, err
    scores = json.loads(out)["scores"]
    assert [s["row"] for s in scores] == [1, 3, 5]
    assert [s["rewards"]["exact_grader"] for s in scores] == [1.0, 0.0, 0.0]
    assert set(scores[0]["rewards"]) == {"exact_grader", "length_penalty", "close_answer_reward"}
    first = scores[0]["rewards"]
    total = 2.0 * first["exact_grader"] + first["length_penalty"] + 0.5 * first["close_answer_reward"]
    assert scores[0]["total"] == pytest.approx(total)
    code, out, err = cli("graders", "run", rft_spec, "--rows", "2")  # the dataset's completion column, as a table
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["row", "exact_grader", "length_penalty", "close_answer_reward", "total"]
    assert [line.split()[:2] for line in lines[1:3]] == [["0", "1.0000"], ["1", "1.0000"]] and lines[3].startswith(
        "mean"
    )


@pytest.mark.parametrize(
    "lines, expect",
    [
        (['{"row": 99, "completion": "4"}'], 'line 1: "row" must be a dataset row, 0 to 5'),
        (['{"row": 0, "text": "4"}'], 'line 1: "completion" must be text or a list of messages'),
        (['{"row": 0, "completion": "4"}', "not json"], "line 2: not JSON"),
    ],
)
def test_graders_run_refuses_bad_completions(rft_spec, tmp_path, lines, expect):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, out, err = cli("graders", "run", rft_spec, "--completions", path)
    assert code == 2 and expect in err and out == ""


def test_graders_run_names_a_missing_completions_file(rft_spec, tmp_path):
    missing = tmp_path / "nope.jsonl"
    code, out, err = cli("graders", "run", rft_spec, "--completions", missing)
    assert (code, out, err) == (2, "", f"grpoflow: --completions {missing}: no such file\n")  # not "spec rejected"


# A python grader broken on every row: refused as a function reward that raises is, by validate's dry run and by
# graders run (it passed both with exit 0, the same warning once per row).
BROKEN_GRADERS = [
    # it reads a column no row has
    ("    return item['nonexistent']", "KeyError: 'nonexistent'"),
    # it returns no number
    ("    return 'high'", "grade() returned str 'high', expected a number"),
]


def grader_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == reward.__name__]


@pytest.mark.parametrize("body, error", BROKEN_GRADERS)
def test_a_python_grader_that_scores_nothing_is_refused(rft_spec, caplog, body, error):
    spec = yaml.safe_load(rft_spec.read_text())
    spec["rewards"] = [{"grader": python_grader(f"def grade(sample, item):\n{body}\n")}]
    spec["evaluation"] = {"holdout": 0}
    rft_spec.write_text(yaml.safe_dump(spec))
    code, _, err = cli("validate", rft_spec)
    refusals = [line for line in err.splitlines() if line.startswith("  - ")]
    assert code == 2 and refusals == [
        f"  - rewards[0]: reward 'py' scored none of the 4 completions ({error}) on dataset row 0"
    ], err
    # The refusal, once, is the whole message: not after the grader's own "4 of 4 completions not scored" warning.
    assert err.count(error) == 1 and "not scored" not in err, err
    assert grader_warnings(caplog) == []
    code, out, err = cli("graders", "run", rft_spec, "--rows", "3")
    assert code == 2 and out == "", out
    assert f"reward 'py' scored none of the 3 completions (row 0: {error})" in err


def test_a_grader_that_scores_some_completions_warns_once(rft_spec, caplog):
    """A grader that cannot score some completions passes the dry run, which logs its warning once (not once per
    row); called as TRL calls it in training, it warns at each call, as before."""
    spec = yaml.safe_load(rft_spec.read_text())
    source = "def grade(sample, item):\n    return float(sample['output_text'])\n"  # "" and "<answer>..." are not
    spec["rewards"] = [{"grader": python_grader(source)}]
    spec["evaluation"] = {"holdout": 0}
    rft_spec.write_text(yaml.safe_dump(spec))
    code, _, err = cli("validate", rft_spec)
    line = "grader 'py': 3 of 4 completions not scored (None): ValueError: could not convert string to float: ''"
    assert code == 0 and grader_warnings(caplog) == [line], err
    caplog.clear()
    training = get_grader_reward(python_grader(source))
    for _ in range(2):
        assert asyncio.run(training(["1", "one"])) == [1.0, None]
    assert len(grader_warnings(caplog)) == 2 and "1 of 2 completions not scored" in grader_warnings(caplog)[0]


def test_graders_run_without_completions_says_how_to_give_them(tmp_path):
    code, _, err = cli("graders", "run", grader_spec(tmp_path, [{"prompt": "2+2?", "answer": "4"}]))
    assert code == 2 and "has no 'completion' column to score" in err and "--completions FILE.jsonl" in err


def test_graders_run_shows_what_a_grader_could_not_score(rft_spec, tmp_path):
    spec = yaml.safe_load(rft_spec.read_text())
    spec["rewards"] = [
        {"grader": python_grader("def grade(sample, item):\n    return 1 / int(sample['output_text'])\n")}
    ]
    rft_spec.write_text(yaml.safe_dump(spec))
    code, out, err = cli("graders", "run", rft_spec, "--rows", "2")
    assert code == 0, err
    assert out.splitlines()[1].split() == ["0", "None", "0.0000"]  # 1 / 0: not scored, the total counts it 0
    assert "py: 1 completion(s) not scored (None); first, row 0: ZeroDivisionError: division by zero" in out


# --- OpenAI's datasets as they are: examples/openai-rft ------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai-rft"


def test_the_example_grader_is_openais_own_object_unchanged():
    openai_job = json.loads((EXAMPLE / "openai-job.json").read_text())
    spec, _ = load_spec(EXAMPLE / "job.yaml")
    assert spec.rewards[0].grader == openai_job["method"]["reinforcement"]["grader"]


def test_graders_run_on_the_example(monkeypatch):
    monkeypatch.chdir(EXAMPLE.parents[1])  # the README's commands run from the checkout
    code, out, err = cli(
        "graders", "run", EXAMPLE / "job.yaml", "--completions", EXAMPLE / "completions.jsonl", "--json"
    )
    assert code == 0, err
    # right; right in a sentence (close only); wrong; right with spaces (close only); no number; right
    assert [s["rewards"]["answer"] for s in json.loads(out)["scores"]] == [1.0, 0.5, 0.1, 0.5, 0.0, 1.0]


def test_a_trailing_assistant_message_is_refused_naming_the_rows(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": "2+2?"}], "reference_answer": "4"},
        {
            "messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}],
            "reference_answer": "5",
        },
    ]
    data = write_jsonl(tmp_path / "rft.jsonl", rows)
    spec = {
        "name": "g",
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(data), "prompt_column": "messages"},
        "rewards": [{"grader": {**string_check("eq"), "reference": "{{ item.reference_answer }}"}}],
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    code, _, err = cli("validate", tmp_path / "s.yaml")
    assert code == 2 and "ends with an assistant message in 1 row (row 2;" in err and "OpenAI's RFT format" in err


def test_the_developer_role_reaches_the_chat_template_as_system():
    import datasets

    from grpoflow.trainers.model.load import prepare_prompts

    rows = [json.loads(line) for line in (EXAMPLE / "train.jsonl").read_text().splitlines()[:3]]
    shaped = prepare_prompts(datasets.Dataset.from_list(rows), "messages", None)
    assert [m["role"] for m in shaped[0]["prompt"]] == ["system", "user"]
    assert shaped[0]["reference_answer"] == rows[0]["reference_answer"]  # the reference fields stay columns (item)


@pytest.mark.slow
def test_the_example_trains_from_openais_format(tmp_path, monkeypatch, prefect_server):
    monkeypatch.chdir(EXAMPLE.parents[1])
    code, out, err = cli(
        "--output-uri", tmp_path / "runs", "run", EXAMPLE / "job.yaml", "--json",
        "--set", "hyperparameters.max_steps=2", "--set", "hyperparameters.rollouts_per_prompt=2",
        "--set", "hyperparameters.prompts_per_step=2", "--set", "hyperparameters.max_response_length=4",
        "--set", "evaluation.every=0", "--set", "evaluation.holdout=2",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    from grpoflow.trainers.metrics import read_metrics

    job = Path(json.loads(out)["output_dir"])
    rows = read_metrics(job / "metrics.jsonl")
    assert len(rows) == 2 and all("rewards/answer/mean" in r["values"] for r in rows)
    assert json.loads((job / "evaluation.json").read_text())["metric"] == "answer"
