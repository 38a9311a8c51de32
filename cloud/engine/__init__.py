"""The target engines the scheduler drives, behind one scorer role (:mod:`.base`): the HF
reference, the static engine, a paced wrapper, and the KV budget at start-up."""
