"""The simulated model's greedy tokens and their log-probabilities (SIMULATED values).

At output position i an unregressed server ranks token i first (logprob CHOSEN), the near tie
i + NEAR_TIE_OFFSET second (NEAR_TIE, NEAR_GAP below it), then i+1, i+2, ... far below
(FAR, FAR-1, ...): a valid distribution whose first choice is clear and whose second is close.
SGLANG_SIM_REGRESS moves a server's choice:

- outputs=changed: token i+1 at position i, which the baseline ranks FAR: a real change;
- outputs=near: at every NEAR_EVERY-th position (3, 11, 19, ...) the near tie instead, its
  ranking of the two swapped, as a new release's kernels may flip a near tie.

The answer's shape is SGLang 0.5.23's (tokenizer_manager.add_logprob_to_meta_info,
detokenize_logprob_tokens): per output token [logprob, token_id, text or None].
"""

from __future__ import annotations

from typing import Any

from sglang_fleet.known.sim_regress import Regression

CHOSEN, NEAR_TIE, FAR = -0.6, -0.8, -7.0
NEAR_GAP = CHOSEN - NEAR_TIE
NEAR_TIE_OFFSET = 100_000
NEAR_EVERY, NEAR_AT = 8, 3


def near_tie(token: int) -> int:
    return token + NEAR_TIE_OFFSET


def flips(i: int, regress: Regression) -> bool:
    """outputs=near: this position's greedy token is the baseline's second choice."""
    return regress.outputs_near and i % NEAR_EVERY == NEAR_AT


def chosen(i: int, regress: Regression) -> int:
    """The greedy token at output position i."""
    if flips(i, regress):
        return near_tie(i)
    return i + regress.token_offset


def ranking(i: int, regress: Regression, n: int) -> list[tuple[float, int]]:
    """The n most likely tokens at position i, as (logprob, token id), best first."""
    anchor = i + regress.token_offset
    first, second = (near_tie(i), i) if flips(i, regress) else (anchor, near_tie(anchor))
    ranked = [(CHOSEN, first), (NEAR_TIE, second)]
    ranked += [(FAR - k, anchor + 1 + k) for k in range(max(n - 2, 0))]
    return ranked[:n]


def logprob_meta(ids: list[int], regress: Regression, top_n: int,
                 text_of=None) -> dict[str, Any]:
    """meta_info's logprob fields for these output tokens, as 0.5.23 returns them for a
    request with return_logprob (logprob_start_len -1: no prompt positions) and
    top_logprobs_num top_n; `text_of` gives each token's text (return_text_in_logprobs)."""

    def entry(logprob: float, token: int) -> list[Any]:
        return [logprob, token, text_of(token) if text_of else None]

    out: dict[str, Any] = {
        "input_token_logprobs": [],
        "output_token_logprobs": [entry(ranking(i, regress, 1)[0][0], t)
                                 for i, t in enumerate(ids)],
        "output_token_logprobs_length": len(ids),
    }
    if top_n > 0:
        out["input_top_logprobs"] = []
        out["output_top_logprobs"] = [[entry(lp, t) for lp, t in ranking(i, regress, top_n)]
                                      for i in range(len(ids))]
    return out
