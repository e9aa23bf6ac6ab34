r"""
The onset by the flow through the answer's position (``ig_lens_flow``) beside
the restoration study's methods, on the embedded models' shipped facts:

    python benchmarks/flow_onset.py smollm2 --limit 50 --json flow_smollm2.json
    python benchmarks/flow_onset.py gemma3 --limit 50 --json flow_gemma3.json
    python benchmarks/flow_onset.py --dry-run       # a tiny random model (CI)

It runs the restoration study (both corruptions, ``--noise-seeds`` draws, the
methods of ``METHODS`` with ``ig_lens_flow``: one flow graph per fact and draw
under the noise, per fact under the counterfactual subject), as
``captum-iglens validate --test restoration --methods ...,ig_lens_flow`` does,
and prints its table: per corruption, each method's onset against the causal
onset (the share within ±2 blocks, mean lateness, mean |Δonset|, with BCa 95%
intervals over the tokens the corruption affects), then what each part cost:
the flows beside restoration's ``L × seeds`` forwards.
``--json`` writes the study (``RestorationResult``, the flow's shares and
onsets in ``traced_shares`` and ``traced_onsets``).
"""

import argparse
import sys
from pathlib import Path

from captum_iglens._utils.output_paths import check_writable
from captum_iglens.attr.flow import DEFAULT_STEPS
from captum_iglens.studies.validation import (
    StudyOptions,
    load_facts,
    run_restoration,
)

METHODS = ("ig_lens", "ig_lens_abs", "ig_lens_joint", "dla", "random", "ig_lens_flow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", choices=("smollm2", "gemma3"))
    parser.add_argument("--limit", type=int, default=50, help="first N facts")
    parser.add_argument("--noise-seeds", type=int, default=3)
    parser.add_argument("--n-steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--json", type=Path, help="write the study")
    parser.add_argument("--dry-run", action="store_true", help="a tiny model")
    args = parser.parse_args()
    if args.json is not None:
        check_writable(args.json, "--json")
    if args.dry_run:
        model, tokenizer, facts = tiny_study()
        args.limit, args.noise_seeds, args.n_steps = len(facts), 2, 2
    elif args.model is None:
        parser.error("model: expected smollm2 or gemma3 (or --dry-run)")
    else:
        from captum_iglens.hf.models import load_embedded

        model, tokenizer = load_embedded(args.model, progress=False)
        facts = load_facts()
    study = StudyOptions(noise_seeds=args.noise_seeds, flow_steps=args.n_steps)
    result = run_restoration(
        model,
        tokenizer,
        facts[: args.limit],
        methods=METHODS,
        study=study,
        progress=not args.dry_run,
    )
    print(result.format_table())
    if args.json is not None:
        result.save(args.json)
        print(f"wrote {args.json}")


def tiny_study():
    """A 4-block random Llama, a word tokenizer and four facts whose subjects
    pair up (as the tests' restoration study), from the tests' helpers."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from captum_iglens.studies.validation import Fact
    from captum_iglens.studies.validation import facts as facts_module
    from tests.helpers import word_tokenizer
    from tests.tiny_models import VOCAB, tiny_model

    facts_module.SUBJECT_PATTERNS["tiny"] = r"^w4 (?P<subject>.+) w5 w6$"
    prompts = ["w4 w10 w11 w5 w6", "w4 w20 w21 w5 w6", "w4 w30 w5 w6", "w4 w40 w5 w6"]
    facts = [Fact(f"t{i}", "tiny", p, answer=f"a{i}") for i, p in enumerate(prompts)]
    return tiny_model("llama", num_hidden_layers=4), word_tokenizer(VOCAB), facts


if __name__ == "__main__":
    main()
