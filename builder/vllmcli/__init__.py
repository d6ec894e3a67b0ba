"""The project's model of the serve commands' command lines (vLLM's above all): the options each
typed serve setting renders, and a reader of an argv with the rules of vLLM's own parser
(abbreviations, `=` forms, JSON configs with dotted keys). Versioned with the vLLM wheels it was
read from, so it is its own room, below the manifest that uses it."""
