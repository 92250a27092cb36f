#!/usr/bin/env python3
"""The fleet binary's code order (crates/hollow/code-order.txt), from what a fleet ran: used by hack/code-order.sh.

  code-order.py write BINARY OUT INPUT...   the functions named by the inputs, in their order, as BINARY names them
  code-order.py faults BINARY ORDER PERF_DATA LIST   adds to LIST the functions whose first run faulted a page of
                                                      BINARY's code outside the ordered ones (perf page-fault records)

An input is either a text dump of a merged instrumented profile (`llvm-profdata show --all-functions --counts`: a
function ran if any of its counters is above zero) or a list of symbol names, one per line (a `.list` file).
Functions the profile has that BINARY does not (inlined there) are skipped; a name BINARY carries with a
`.llvm.<n>` suffix (functions made visible across codegen units) matches the profile's name without it. When
most names are not found (the profile came from a build with another cargo profile, e.g. without link-time
optimisation, which hashes every symbol differently), a name matches BINARY's functions of the same path whatever
their hash; the instances of one generic function share a path, so all of them are taken.
"""
import bisect
import collections
import os
import re
import subprocess
import sys


def functions(binary):
    """(address, size, name) of every function symbol of BINARY, by address."""
    out = subprocess.run(['nm', '-n', '--defined-only', '-S', binary], capture_output=True, text=True, check=True)
    syms = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in 'tTwW':
            syms.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    return syms


def ran(dump):
    """Names of the functions with a counter above zero in an llvm-profdata text dump."""
    names, name, hot = [], None, False
    for line in open(dump):
        if line.startswith('  ') and not line.startswith('   ') and line.rstrip().endswith(':'):
            if name is not None and hot:
                names.append(name)
            name, hot = line.strip()[:-1], False
        elif line.startswith(('    Function count:', '    Block counts:')) and re.search(r'[1-9]', line.split(':', 1)[1]):
            hot = True
    if name is not None and hot:
        names.append(name)
    # a function local to its unit is named `<unit>;<symbol>`
    return [n.rsplit(';', 1)[-1] for n in names]


def unsuffixed(name):
    return re.sub(r'\.llvm\.\d+$', '', name)


def unhashed(name):
    return re.sub(r'17h[0-9a-f]{16}E$', 'E', unsuffixed(name))


def write(binary, out, inputs):
    syms = functions(binary)
    size = {n: s for _, s, n in syms}
    variants, paths = collections.defaultdict(list), collections.defaultdict(list)
    for _, _, n in syms:
        variants[unsuffixed(n)].append(n)
        paths[unhashed(n)].append(n)
    lists = [[l.strip() for l in open(p) if l.strip()] if p.endswith('.list') else ran(p) for p in inputs]
    every = [n for names in lists for n in names]
    by_path = sum(unsuffixed(n) in variants for n in every) < len(every) // 4
    if by_path:
        print('most names are not in the binary as they are: matching them by path')
    order, seen = [], set()
    for path, names in zip(inputs, lists):
        before, missing = sum(size[n] for n in order), 0
        for n in names:
            found = variants.get(unsuffixed(n))
            if not found and by_path:
                found = paths.get(unhashed(n))
            if not found:
                missing += 1
            for v in found or ():
                if v not in seen:
                    seen.add(v)
                    order.append(v)
        added = sum(size[n] for n in order) - before
        print(f'{path}: {len(names)} functions ran, {missing} not in the binary; {added / 2**20:.2f} MiB of code added')
    total = sum(s for _, s, _ in syms)
    print(f'ordered: {len(order)} functions, {sum(size[n] for n in order) / 2**20:.2f} MiB '
          f'of the binary\'s {total / 2**20:.2f} MiB')
    with open(out, 'w') as f:
        f.write(''.join(n + '\n' for n in order))


def faults(binary, order_file, perf_data, list_file):
    syms = functions(binary)
    starts = [a for a, _, _ in syms]
    # the code segment's addresses in the file (symbols) less its offsets (the mapping)
    segments = subprocess.run(['readelf', '-lW', binary], capture_output=True, text=True, check=True).stdout
    loads = [l.split() for l in segments.splitlines() if l.split()[:1] == ['LOAD']]
    code = next(f for f in loads if 'E' in f[6:-1])  # flags between the sizes and the alignment: R E
    code_shift = int(code[2], 16) - int(code[1], 16)
    ordered = {l.strip() for l in open(order_file) if l.strip()}
    end = max((a + s for a, s, n in syms if n in ordered), default=0)
    script = subprocess.run(['perf', 'script', '-i', perf_data, '-F', 'addr', '--show-mmap-events'],
                            capture_output=True, text=True, check=True).stdout
    text, culprits = None, collections.Counter()
    for line in script.splitlines():
        if 'PERF_RECORD_MMAP2' in line:
            if ' r-xp ' in line and line.rstrip().endswith(binary):
                span = line.split('[', 1)[1].split(']', 1)[0]
                base, length = span.split('(')
                offset = int(span.split('@ ')[1].split()[0], 16)
                text = (int(base, 16), int(length.split(')')[0], 16), offset)
            continue
        if text is None or not line.strip():
            continue
        addr = int(line.split()[0], 16)
        if not text[0] <= addr < text[0] + text[1]:
            continue
        vaddr = addr - text[0] + text[2] + code_shift
        i = bisect.bisect_right(starts, vaddr) - 1
        if vaddr >= end and i >= 0 and syms[i][0] <= vaddr < syms[i][0] + syms[i][1]:
            culprits[syms[i][2]] += 1
    old = [l.strip() for l in open(list_file) if l.strip()] if os.path.exists(list_file) else []
    new = [n for n in culprits if n not in ordered and n not in old]
    with open(list_file, 'w') as f:
        f.write(''.join(n + '\n' for n in old + new))
    print(f'{sum(culprits.values())} faults in code outside the ordered functions; {len(new)} functions added, '
          f'{len(old) + len(new)} listed')


if __name__ == '__main__':
    if len(sys.argv) >= 5 and sys.argv[1] == 'write':
        write(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 6 and sys.argv[1] == 'faults':
        faults(*sys.argv[2:])
    else:
        sys.exit(__doc__)
