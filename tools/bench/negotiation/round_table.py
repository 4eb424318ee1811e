#!/usr/bin/python3
"""The table of tools/bench/negotiation/namespaces: per variant, whether the
results were exact, whether every node launched alike, and the negotiation
rounds' latency from the agents' histograms. Exits 1 when a variant's
trainers failed or its launch traces differ."""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys

BUCKET = re.compile(
    r'^baton_negotiation_round_seconds_bucket\{(?P<labels>[^}]*)\} (?P<v>\S+)$')


def label(labels, key):
    m = re.search(key + r'="([^"]*)"', labels)
    return m.group(1) if m else None


def histograms(path):
    """{node role: {upper bound: cumulative count}} summed over the agents."""
    out = {}
    for line in open(path):
        m = BUCKET.match(line.strip())
        if not m:
            continue
        role = label(m.group('labels'), 'started_by')
        le = label(m.group('labels'), 'le')
        bound = math.inf if le == '+Inf' else float(le)
        per = out.setdefault(role, {})
        per[bound] = per.get(bound, 0) + float(m.group('v'))
    return out


def quantile(cumulative, q):
    """Linear interpolation within the bucket that holds quantile q."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]]
    if total == 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for b in bounds:
        if cumulative[b] >= rank:
            if math.isinf(b):
                return lower  # past the last finite bound
            inside = cumulative[b] - below
            frac = (rank - below) / inside if inside else 1.0
            return lower + frac * (b - lower)
        lower, below = b, cumulative[b]
    return lower


def us(seconds):
    return '-' if seconds is None else f'{seconds * 1e6:,.0f} us'


def traces(directory):
    """(identical, launches per node, files)."""
    files = sorted(glob.glob(os.path.join(directory, '*.launches')))
    contents = [open(f).read() for f in files]
    identical = bool(contents) and all(c == contents[0] for c in contents)
    return identical, (contents[0].count('\n') if contents else 0), len(files)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--logs', required=True)
    p.add_argument('--nodes', type=int, required=True)
    p.add_argument('--steps', type=int, required=True)
    p.add_argument('--tensors', type=int, required=True)
    p.add_argument('--agent-flags', default='')
    p.add_argument('--agent-bin', default='')
    p.add_argument('--rate', default='')
    p.add_argument('variants', nargs='+')
    a = p.parse_args()

    print(f'{a.nodes} agents in network namespaces on one machine '
          f'({"links shaped to " + a.rate + " Mbit/s" if a.rate else "unshaped veth links"}), '
          f'one trainer each: {a.steps} steps of {a.tensors} int64 tensors '
          f'push-pulled at once, every element checked.'
          + (f' Agent flags for all: `{a.agent_flags}`.' if a.agent_flags else '')
          + (f' Agent binary: `{a.agent_bin}`.' if a.agent_bin else ''))
    print()
    print('| variant | agent flags | exact results | one launch order | launches per node '
          '| rounds per node | round p50, started here | p99 '
          '| round p50, joined | p99 | step p50 | step p99 |')
    print('|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|')
    bad = []
    for name in a.variants:
        d = os.path.join(a.logs, name)
        flags = open(os.path.join(a.logs, name + '.flags')).read().strip()
        ok = open(os.path.join(d, 'trainers_ok')).read().strip() == '1'
        rows = [json.loads(l) for l in open(os.path.join(d, 'trainers.jsonl'))]
        exact = ok and len(rows) == a.nodes
        checked = sum(r['elements_checked'] for r in rows)
        identical, launches, files = traces(os.path.join(d, 'traces'))
        identical = identical and files == a.nodes
        h = histograms(os.path.join(d, 'metrics.txt'))
        started = h.get('this_node', {})
        joined = h.get('peer', {})
        count = lambda c: c[max(c)] if c else 0
        rounds = (count(started) + count(joined)) / a.nodes
        med = lambda key: (statistics.median(r[key] for r in rows)
                           if rows else None)
        step50, step99 = med('step_p50_us'), med('step_p99_us')
        print(f'| {name} | `{flags or "(none)"}` '
              f'| {"yes, " + format(checked, ",") + " elements" if exact else "NO"} '
              f'| {"yes" if identical else "NO"} ({files} traces) | {launches:,} '
              f'| {rounds:,.0f} '
              f'| {us(quantile(started, 0.5) if started else None)} '
              f'| {us(quantile(started, 0.99) if started else None)} '
              f'| {us(quantile(joined, 0.5) if joined else None)} '
              f'| {us(quantile(joined, 0.99) if joined else None)} '
              f'| {"-" if step50 is None else format(step50, ",.0f") + " us"} '
              f'| {"-" if step99 is None else format(step99, ",.0f") + " us"} |')
        if not exact:
            bad.append(f'{name}: a trainer failed or reported nothing')
        if not identical:
            bad.append(f'{name}: the launch traces differ (or are missing)')
    print()
    print('Round latency: each node\'s NegotiationWire::ExchangeMin, from the '
          'agents\' baton_negotiation_round_seconds histograms summed over the '
          'nodes (p50/p99 interpolated within the buckets); "started here": '
          'nodes with news of their own (started_by="this_node"), "joined": '
          'nodes another\'s round woke (started_by="peer"). Step: '
          'the median over the trainers of each one\'s p50/p99.')
    for b in bad:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
