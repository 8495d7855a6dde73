#!/usr/bin/env python3
"""Static loop sizes of a kernel from `cuobjdump -sass` output, on the CPU machine (no GPU, no profiler).

For each backward branch of the kernel (a loop), prints the loop's address range, its size in SASS instructions and
its most frequent opcodes; the innermost loops come first in address order within an outer loop. Read with the
source: e.g. a decode loop of 199 instructions holding 64 IDP.4A is one 32-code chunk of two rows.

Getting the SASS (cuobjdump is not part of the CUDA compiler install here; pip has it):
  pip install nvidia-cuda-cuobjdump==13.2.51 "nvidia-cuda-nvdisasm==13.2.*"
  export PATH=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia/cu13/bin:$PATH
  cuobjdump -xelf all build/default/examples/CMakeFiles/ling.dir/ling/cmd_bench.cu.o   # writes *.cubin here
  cuobjdump -sass cmd_bench.cu.1.sm_90a.cubin > bench.sass
Usage: tools/perf/sass_loops.py bench.sass FUNCTION-SUBSTRING [--full-opcodes]
"""
import collections
import re
import sys

LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA\s+(0x[0-9a-f]+)")
PRED = re.compile(r"^@!?U?P\w+\s+")


def functions(path):
    text = open(path).read()
    for chunk in re.split(r"\n\s*Function : ", text)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        body = []
        for line in chunk.split("\n"):
            m = LINE.match(line)
            if m:
                body.append((int(m.group(1), 16), m.group(2)))
        yield name, body


def opcode(text, full):
    op = PRED.sub("", text).split()[0]
    return op if full else op.split(".")[0]


def main(path, key, full=False):
    found = False
    for name, body in functions(path):
        if key not in name:
            continue
        found = True
        index = {addr: i for i, (addr, _) in enumerate(body)}
        print(f"{name}: {len(body)} instructions")
        for i, (addr, text) in enumerate(body):
            m = BRANCH.search(text)
            if not m or int(m.group(1), 16) >= addr or int(m.group(1), 16) not in index:
                continue
            j = index[int(m.group(1), 16)]
            ops = collections.Counter(opcode(t, full) for _, t in body[j:i + 1])
            top = ", ".join(f"{o} {n}" for o, n in ops.most_common(10))
            print(f"  loop {body[j][0]:#x}-{addr:#x}: {i - j + 1} instructions: {top}")
    if not found:
        sys.exit(f"no function containing {key!r} in {path}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], "--full-opcodes" in sys.argv[3:])
