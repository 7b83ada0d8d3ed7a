"""Print the agreement of `lint_config` with DeepSpeed's recorded verdicts, by source and by
verdict, and every disagreement with its reason (the tables of docs/config-lint.md).

    .venv/bin/python -m tests.lintdiff.report
"""

from __future__ import annotations

import collections
import json

from tests.lintdiff.record import OUTCOMES
from tests.lintdiff.verdict import KNOWN_DISAGREEMENTS, judge_all, summary


def main() -> None:
    data = json.loads(OUTCOMES.read_text(encoding="utf-8"))
    judged = judge_all(data)
    print(f"Recorded with {data['recorded_with']}, {data['device']}.\n\n{summary(judged)}\n")
    by_source: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case, j in judged:
        source = case["id"].split("/", 1)[0]
        by_source[source][j.deepspeed] += 1
        by_source[source]["agree"] += j.agree
        by_source[source]["all"] += 1
    print("| source | configs | DeepSpeed rejects | runs, not as written | runs as written | linter agrees |")
    print("|---|---|---|---|---|---|")
    for source, n in by_source.items():
        print(f"| {source} | {n['all']} | {n['rejects']} | {n['differs']} | {n['as-written']} | {n['agree']} |")
    print("\n| verdict (DeepSpeed) | configs | linter says the same |\n|---|---|---|")
    for verdict in ("rejects", "differs", "as-written"):
        cases = [j for _, j in judged if j.deepspeed == verdict]
        print(f"| {verdict} | {len(cases)} | {sum(j.agree for j in cases)} |")
    print("\nDisagreements:\n")
    for case, j in judged:
        if not j.agree:
            print(f"- `{case['id']}` ({case['num_stages']} stages × {case['data_parallel']}): DeepSpeed "
                  f"{j.deepspeed} ({'; '.join(j.why) or 'ran as written'}), the linter {j.linter}. "
                  f"{KNOWN_DISAGREEMENTS.get(case['id'], 'NOT EXPLAINED')}")


if __name__ == "__main__":
    main()
