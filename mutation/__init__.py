"""Mutation testing of the durability core, with chaos campaigns as the oracle.

The tool is cosmic-ray: it writes each mutant into the module's file on disk and runs a test
command, so every process the campaign starts (the warm worker template, its forked workers,
the workers that resume a killed turn) imports the mutant. mutmut 3 instead rewrites each
function into a trampoline that picks the mutant from an environment variable, and decides
which tests can reach a mutant by recording calls in the test process; the durability core
runs only in worker processes, so that recording sees none of it. Measured on
hermes/finalizer.py with a campaign as the only test: mutmut 3.8.1 made 86 mutants and ran none
("could not find any test case for any mutant"); cosmic-ray 8.7.0 made 93 and the oracle judged
each one it was given (docs/chaos.md, "Mutation score of the verdict").

Mutants are made in a private copy of the tree (never the shared checkout). The supervisor
and its checker run from a second, pristine copy; only the workers import the mutant, as the
planted defects of tests/defects do. Modules:

- `tree`: the private copies and the digests that decide what must run again
- `mutants`: cosmic-ray's mutants of the core, their stable ids and shards
- `casemap`: which campaign cases execute which core lines (coverage.py in the workers)
- `launch`: runs given campaign cases in-process, workers from another tree
- `oracle`: the test command cosmic-ray runs for one mutant
- `run`: a shard of mutants, reusing results while their module and the oracle are unchanged
- `score`: merge of shards, reviewed equivalents, docs/figures/mutation.json and its rendering
"""
