import csv

with open("/app/sales.csv", newline="") as f:
    rows = list(csv.DictReader(f))
total = 0
for row in rows[1:]:
    total += int(row["amount"])
print(total)
