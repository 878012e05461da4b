"""The pyright tier's oracle per axis count: legal exact / false errors / illegal caught / missed
under pyright and plain mypy, against the rule table (tests/_stubgen_oracle.py).

    PYTHONPATH=$PWD python benchmarks/stubgen_oracle.py dp,tp            # every combination
    PYTHONPATH=$PWD python benchmarks/stubgen_oracle.py dp,tp,fsdp 60    # 60 per form (seeded)
    PYTHONPATH=$PWD python benchmarks/stubgen_oracle.py dp,tp,fsdp,ep 20 pyright
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _stubgen_oracle as oracle

axes = tuple(sys.argv[1].split(","))
sample = int(sys.argv[2]) if len(sys.argv) > 2 else None
for checker in sys.argv[3].split(",") if len(sys.argv) > 3 else ("pyright", "mypy"):
    t = time.time()
    d = Path(tempfile.mkdtemp())
    cs = oracle.cases(axes, sample=sample, seed=len(axes))
    s = oracle.check(d, axes, cs, checker)
    print(checker, len(axes), f"legal {s.legal} exact {s.exact} false {s.false_errors} imprecise {s.imprecise} caught {s.caught} missed {s.missed}  {time.time()-t:.0f}s", flush=True)
    fe = {k: v["false_errors"] for k, v in s.by_class.items() if v["false_errors"]}
    mi = {k: v["missed"] for k, v in s.by_class.items() if v["missed"]}
    print("  false by class", fe, "missed", mi)
    for k in ("false_errors", "missed", "imprecise"):
        for e in s.examples.get(k, [])[:6]:
            print("  ", k, e)
