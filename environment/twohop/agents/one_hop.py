"""One-hop control: skips the first hop. Where the question runs through a person's
employer, it uses the person's own home city instead (and for a city or a country, the
people who live there)."""
from factlib import UNKNOWN, answer, facts, question

f = facts()
home, country = f["lives_in"], f["located_in"]
kind, subject = question()
if kind == "employer_city":
    rows = [home.get(subject, UNKNOWN)]
elif kind == "employer_country":
    rows = [country.get(home.get(subject), UNKNOWN)]
elif kind == "city_employees":
    rows = sorted(p for p, c in home.items() if c == subject)
elif kind == "country_employees":
    rows = sorted(p for p, c in home.items() if country.get(c) == subject)
else:
    rows = [UNKNOWN]
answer(rows)
