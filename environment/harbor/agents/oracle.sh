#!/bin/sh
# The oracle: the task's own reference solution. The trial uploads the task's solution/ to
# /solution (for this agent only) and runs /solution/solve.sh as the task's agent user, its
# output in /logs/agent/oracle.txt; its exit code does not end the trial (Harbor's rule).
exec sh /solution/solve.sh
