"""What bench/numerics-check.sh and bench/numerics-peer.sh share: a run's windows of mean loss
(the file `parity train --loss-log` writes, and bench/numerics_torch.py the same), two runs
compared window by window, and a run's last held-out AUC from its log."""
import math
import re


def windows(path):
    """The windows' means, in order (OSError where the run wrote no file)."""
    return [float(line.split()[1]) for line in open(path) if not line.startswith("#")]


def relative(x, y):
    """Each window's (x - y) / |y|; empty where the runs' windows do not pair up."""
    return [(a - r) / abs(r) for a, r in zip(x, y)] if x and len(x) == len(y) else []


def worst(d):
    return max(map(abs, d)) if d else math.nan


def mean(d):
    return sum(d) / len(d) if d else math.nan


def last_auc(log):
    """The last `AUC x` a run printed (nan where none; OSError where there is no log)."""
    found = re.findall(r"AUC ([0-9.]+)", open(log).read())
    return float(found[-1]) if found else math.nan
