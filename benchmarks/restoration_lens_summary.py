r"""
What a restoration study's JSON (``validate --test restoration --json PATH``) says
about where each method's onset falls relative to the causal onset: per
corruption and method, over the counted tokens, the mean signed difference
``onset − causal onset`` (positive: late), the shares early / same / late, and
the share within ±2 blocks:

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


if __name__ == "__main__":
    main()
