#!/bin/sh
# Control nop: does nothing (the trial runs no command for it). A task this passes rewards an
# untouched container: its verifier checks nothing the agent must do.
exit 0
