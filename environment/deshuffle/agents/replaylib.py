"""The replay attack on deshuffle-papers' shuffle, for the source-peek control. Stdlib only:
it runs beside the agent in /agent, and the tests import it from the source tree.

`generate` keys each task's shuffle with sha256 of (task secret, seed, idx, every unit's JSON
text in true order). Whoever knows that key's inputs but the order replays a *guessed* true
order: if the replay displays the units exactly as paragraphs.jsonl does, the guess is the
gold. `search` tries every order within a few relocations of a heuristic answer against every
(secret, seed, idx) guess, within a budget of replays. The harness never shows the secret,
so in the sandbox this must find nothing; a test hands it the secret and shows that it then
finds the gold, and that `displayed` reproduces the generator exactly (a drift would make the
control test nothing).
"""
import hashlib
import random

ENV_NAME = "deshuffle-papers"


def shuffle_key(secret, seed, idx, texts):
    """generate's key: `texts` are the units' JSON texts (bytes) in the guessed true order."""
    head = f"{ENV_NAME}:shuffle:{secret}:{seed}:{idx}".encode()
    return hashlib.sha256(head + b"".join(t + b"\n" for t in texts)).digest()


def displayed(key, m):
    """Position → true-order unit index, as generate's `Rng(key).shuffle` lays them out."""
    rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
    order = list(range(m))
    for i in range(m - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        order[i], order[j] = order[j], order[i]
    return order


def confirms(seq, texts, guess):
    """Whether the true order `seq` (labels, papers concatenated in the generator's paper
    order) replays to the displayed labels 1..M under `guess` = (secret, seed, idx)."""
    order = displayed(shuffle_key(*guess, [texts[label] for label in seq]), len(seq))
    return all(seq[unit] == position for position, unit in enumerate(order, 1))


def relocations(seq):
    """Every order one move from `seq`: one label taken out and put back elsewhere."""
    for i, x in enumerate(seq):
        rest = seq[:i] + seq[i + 1:]
        for j in range(len(seq)):
            if j != i:
                yield rest[:j] + [x] + rest[j:]


def neighbourhood(start, moves):
    """`start`, then every order within 1, 2, ... `moves` relocations of it, each once."""
    seen = {tuple(start)}
    yield list(start)
    frontier = [list(start)]
    for _ in range(moves):
        nxt = []
        for seq in frontier:
            for cand in relocations(seq):
                t = tuple(cand)
                if t not in seen:
                    seen.add(t)
                    nxt.append(cand)
                    yield cand
        frontier = nxt


def search(start, texts, guesses, moves=2, budget=100_000):
    """(the first order near `start` some guess confirms, or None; replays tried)."""
    tried = 0
    for cand in neighbourhood(start, moves):
        for guess in guesses:
            if tried >= budget:
                return None, tried
            tried += 1
            if confirms(cand, texts, guess):
                return cand, tried
    return None, tried
