#!/usr/bin/env python3
"""A model of attnCommShrink's agreement (src/core/shrink_agreement.cc).

Every rank calls attnCommShrink with a random exclude list; messages are
delivered in random order, and a rank handles its mailbox lowest sender
first, as Bootstrap::recvAny does. When nothing is left to deliver, checks:

  - consistency: a rank that agreed has every survivor of its list agreed
    under the same leader (else the new communicator would wait for one);
  - liveness: a rank still waiting is one that an agreeing rank it counts
    on excludes (an excluded rank that called, which the API forbids), or
    one that waits on such a rank.

Usage: shrink_agreement_model.py [trials] [seed]. Exits 1 on a violation.
Keep it in step with the C++ state machine.
"""
import random
import sys

GREET, REQUEST, REFUSE, VERDICT = 1, 2, 3, 4
AGREED, FAILED = 0, 1


class Rank:
    def __init__(self, rank, nranks, excluded):
        self.rank = rank
        self.nranks = nranks
        self.excluded = set(excluded)
        self.survivors = [r for r in range(nranks) if r not in self.excluded]
        self.leader = self.survivors[0]
        self.digest = tuple(sorted(excluded))
        self.outcome = None  # None (waiting), "agreed", "failed"
        self.mailbox = []
        self.outbox = []
        if self.leads():
            self.pending = set(self.survivors[1:])
            for m in self.pending:
                self.post(m, GREET)
            if not self.pending:
                self.agree()
        else:
            self.post(self.leader, REQUEST, self.digest)

    def leads(self):
        return self.rank == self.leader

    def post(self, to, kind, arg=None):
        self.outbox.append((to, (kind, self.rank, arg)))

    def agree(self):
        self.outcome = "agreed"
        for m in self.survivors[1:]:
            self.post(m, VERDICT, AGREED)

    def fail(self):
        # failAll: every other rank, the excluded ones included.
        self.outcome = "failed"
        for r in range(self.nranks):
            if r != self.rank:
                self.post(r, VERDICT, FAILED)

    def step(self):
        """Handles the lowest sender's message; False when there is none."""
        if self.outcome or not self.mailbox:
            return False
        self.mailbox.sort(key=lambda m: m[1])
        kind, sender, arg = self.mailbox.pop(0)
        if self.leads():
            if sender in self.excluded:
                if kind in (GREET, REQUEST):
                    self.post(sender, REFUSE)
            elif kind == REQUEST and sender in self.pending and arg == self.digest:
                self.pending.discard(sender)
                if not self.pending:
                    self.agree()
            elif kind == VERDICT and arg == FAILED:
                self.fail()
            elif kind in (REQUEST, GREET, REFUSE):
                self.fail()
        elif sender == self.leader:
            if kind == VERDICT and arg == AGREED:
                self.outcome = "agreed"
            elif kind in (VERDICT, REFUSE, REQUEST):
                self.fail()
        elif kind in (GREET, REQUEST):
            self.post(sender, REFUSE)
        elif kind == VERDICT and arg == FAILED and sender not in self.excluded:
            self.fail()
        return True


def run(lists, rng):
    ranks = [Rank(r, len(lists), lists[r]) for r in range(len(lists))]
    in_flight = []
    while True:
        for k in ranks:
            in_flight += k.outbox
            k.outbox = []
        ready = [k for k in ranks if not k.outcome and k.mailbox]
        if not in_flight and not ready:
            return ranks
        if in_flight and (not ready or rng.random() < 0.5):
            to, msg = in_flight.pop(rng.randrange(len(in_flight)))
            ranks[to].mailbox.append(msg)
        else:
            rng.choice(ready).step()


def violations(ranks):
    found = []
    for k in ranks:
        if k.outcome == "agreed":
            for s in k.survivors:
                if ranks[s].outcome != "agreed" or ranks[s].leader != k.leader:
                    found.append("rank %d agreed but survivor %d did not" % (k.rank, s))
    waiting = [k.rank for k in ranks if not k.outcome]
    excused = {r for r in waiting
               if any(ranks[x].outcome == "agreed" and r in ranks[x].excluded for x in ranks[r].survivors)}
    while True:
        more = {r for r in waiting if r not in excused and any(x in excused for x in ranks[r].survivors)}
        if not more:
            break
        excused |= more
    found += ["rank %d waits for the timeout" % r for r in waiting if r not in excused]
    return found


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 30000
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    bad = 0
    for _ in range(trials):
        n = rng.randint(2, 5)
        lists = []
        for r in range(n):
            others = [x for x in range(n) if x != r]
            lists.append(rng.sample(others, rng.randint(0, min(2, len(others)))))
        found = violations(run(lists, rng))
        if found:
            bad += 1
            if bad <= 5:
                print("lists %s: %s" % (lists, "; ".join(found)))
    print("%d runs, %d with a violation" % (trials, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
