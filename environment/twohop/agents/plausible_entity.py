"""Plausible-entity control: follows every chain it can, and where one breaks names a
plausible entity instead of declining — the person's home city for a missing headquarters,
that city's country (or the commonest country) for a missing country. Right wherever the
chain is whole; judged on the broken category, where it must score 0."""
from factlib import UNKNOWN, answer, facts, modal, question

f = facts()
employer, hq, country, home = f["works_for"], f["headquartered_in"], f["located_in"], f["lives_in"]
kind, subject = question()
city = hq.get(employer.get(subject))
if kind == "employer_city":
    rows = [city or home.get(subject) or modal(hq) or UNKNOWN]
elif kind == "employer_country":
    rows = [country.get(city) or country.get(home.get(subject)) or modal(country) or UNKNOWN]
else:
    place = (lambda c: c) if kind == "city_employees" else country.get
    rows = sorted(p for p, o in employer.items() if hq.get(o) and place(hq[o]) == subject)
    rows = rows or sorted(p for p, c in home.items() if place(c) == subject)
answer(rows)
