"""Always-unknown control: declines every question. Right on the broken category only."""
from agentlib import dumps, reply

reply(dumps({"rows": ["unknown"]}))
