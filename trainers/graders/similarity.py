"""`text_similarity`'s metrics, each computed by the library that defines it, as a score in 0..1.

| metric | computed by |
| --- | --- |
| `fuzzy_match` | rapidfuzz: `fuzz.WRatio(input, reference) / 100` |
| `bleu` | sacrebleu: `sentence_bleu(input, [reference]).score / 100` (its defaults: 13a tokens, exp smoothing) |
| `gleu` | NLTK: `sentence_gleu([words(reference)], words(input))` (Google's GLEU) |
| `meteor` | NLTK: `meteor_score([words(reference)], words(input))` (needs NLTK's WordNet data) |
| `rouge_1` ... `rouge_5`, `rouge_l` | rouge-score: `RougeScorer([rougeN]).score(reference, input)` F-measure |
| `cosine` | an OpenAI-compatible embeddings endpoint (see `grpoflow.trainers.graders.reward`) |

The NLTK metrics take tokens: `words` splits a text as NLTK's `word_tokenize` does (its Treebank-style tokenizer:
punctuation and clitics apart, "Tokyo." is `Tokyo` and `.`), without its sentence splitter, whose data (punkt_tab) is
a separate download and would make a score depend on the machine. Whitespace tokens scored "The capital is Tokyo."
against "Tokyo" 0 (no token `Tokyo`); GLEU is the smaller of n-gram (1-4) precision and recall, so it is 1/14 (one
matching 1-gram out of the answer's 14 n-grams): a long answer holding a short reference scores low, never 0. Scores
are case-sensitive, as BLEU's. The libraries come with `pip install 'grpoflow[graders]'`; `metric_problem` says
which one is missing before anything is scored.
"""

from __future__ import annotations

# The metrics' libraries (the optional `grpoflow[graders]` extra) are imported when a metric scores.
import functools
from collections.abc import Callable


def similarity(metric: str, output: str, reference: str) -> float:
    """The `metric` similarity of `output` to `reference`, in 0..1 (not `cosine`: that one needs an endpoint).

    >>> similarity("fuzzy_match", "the cat sat", "the cat sat")
    1.0
    >>> round(similarity("rouge_1", "the cat sat", "the cat sat down"), 4)
    0.8571
    """
    # Clipped: sacrebleu's 100-point scale gives 100.00000000000004 for identical texts.
    return min(1.0, max(0.0, float(_scorer(metric)(output, reference))))


def words(text: str) -> list[str]:
    """The tokens the NLTK metrics (gleu, meteor) compare: NLTK's `word_tokenize` of `text` as one line
    (`preserve_line=True`: no sentence splitting, which needs the punkt_tab download).

    >>> words("The capital is Tokyo.")
    ['The', 'capital', 'is', 'Tokyo', '.']
    """
    from nltk.tokenize import word_tokenize

    return word_tokenize(text, preserve_line=True)


@functools.cache
def _scorer(metric: str) -> Callable[[str, str], float]:
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return lambda output, reference: fuzz.WRatio(output, reference) / 100
    if metric == "bleu":
        import sacrebleu

        return lambda output, reference: sacrebleu.sentence_bleu(output, [reference]).score / 100
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return lambda output, reference: sentence_gleu([words(reference)], words(output))
    if metric == "meteor":
        from nltk.translate.meteor_score import meteor_score

        return lambda output, reference: meteor_score([words(reference)], words(output))
    if metric.startswith("rouge_"):
        from rouge_score import rouge_scorer

        kind = f"rouge{metric.removeprefix('rouge_').upper()}"
        scorer = rouge_scorer.RougeScorer([kind])
        return lambda output, reference: scorer.score(reference, output)[kind].fmeasure
    raise ValueError(f"unknown text_similarity metric {metric!r}")
