"""Fail when this environment holds an older release of an analysis dependency than the package index offers:
`make test` is the run against the newest releases, what a new user gets today. One index query per name.
Usage: python .ci/check_newest.py NAME..."""
import re
import subprocess
import sys
from importlib.metadata import version

old = []
for name in sys.argv[1:]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name],
                         capture_output=True, text=True, check=True).stdout
    newest = re.match(r"\S+ \(([^)]+)\)", out).group(1)
    have = version(name)
    print(f"ci: {name} {have} installed, newest {newest}")
    if have != newest:
        old.append(name)
sys.exit(f"ci: not the newest release: {', '.join(old)}" if old else 0)
