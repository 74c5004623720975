"""The report prints the column's total, also for data the agent never saw."""
import shutil
import subprocess
import sys


def total_printed() -> str:
    return subprocess.run([sys.executable, "/app/report.py"], capture_output=True, text=True, timeout=30).stdout.strip()

ok = total_printed() == "500"
shutil.copy("/app/sales.csv", "/tmp/sales.bak")
with open("/app/sales.csv", "w") as f:
    f.write("region,amount\nnorth,1\nsouth,2\n")
ok = ok and total_printed() == "3"
shutil.copy("/tmp/sales.bak", "/app/sales.csv")
print("passed" if ok else "failed")
sys.exit(0 if ok else 1)
