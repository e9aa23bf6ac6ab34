r"""
What a restoration study's JSON (``validate --test restoration --json PATH``) says
about where each method's onset falls relative to the causal onset: per
corruption and method, over the counted tokens, the mean signed difference
``onset − causal onset`` (positive: late), the shares early / same / late, and
the share within ±2 blocks; then, for a result with every onset rule, a
Markdown table per corruption: each method under each rule, the share within
±2, mean |Δonset| and mean lateness (with their BCa intervals) and the
Spearman correlation with the recovery gains:

    python benchmarks/restoration_lens_summary.py RESULT.json
"""

import sys

import numpy as np

from captum_iglens.studies.validation import RestorationResult


def main() -> None:
    result = RestorationResult.load(sys.argv[1])
    print(
        f"{'corruption':<15}{'method':<22}{'n':>4}{'mean signed':>13}"
        f"{'early':>8}{'same':>7}{'late':>7}{'±2':>7}"
    )
    for c in result.corruptions:
        causal = result.causal_onsets[c]
        for m in result.methods:
            diff = result.onsets[m] - causal
            diff = diff[~np.isnan(diff)]
            if not len(diff):
                continue
            print(
                f"{c:<15}{m:<22}{len(diff):>4}{diff.mean():>+13.2f}"
                f"{np.mean(diff < 0):>8.2f}{np.mean(diff == 0):>7.2f}"
                f"{np.mean(diff > 0):>7.2f}{np.mean(np.abs(diff) <= 2):>7.2f}"
            )
    rules_tables(result)


def _interval(stats: dict, form: str) -> str:
    if not stats["n"]:
        return "-"
    # An undefined value is null in a saved file.
    mean, lo, hi = (
        np.nan if stats[k] is None else stats[k] for k in ("mean", "lo", "hi")
    )
    return f"{mean:{form}} [{lo:{form}}, {hi:{form}}]"


def rules_tables(result: RestorationResult) -> None:
    """Markdown: per corruption, a row per method and onset rule."""
    for c, by_rule in result.rules.items():
        n = result.summary[c]["all"]["ig_lens"]["mean_abs_diff"]["n"]
        print(f"\n{c}, {n} tokens counted\n")
        print(
            "| method | rule | within ±2 | mean \\|Δonset\\| | mean lateness "
            "| Spearman vs gains |"
        )
        print("|---|---|---|---|---|---|")
        for m in result.methods:
            for rule, rows in by_rule.items():
                row = rows[m]
                print(
                    f"| {m} | {rule} | {_interval(row['within_2'], '.2f')} | "
                    f"{_interval(row['mean_abs_diff'], '.2f')} | "
                    f"{_interval(row['mean_lateness'], '+.2f')} | "
                    f"{_interval(row['gain_spearman'], '+.3f')} |"
                )


if __name__ == "__main__":
    main()
