"""specrace harness: runtime -> detect -> policies -> oracle/trials -> machines -> report
(no back edges); faults/ (the hook impl/ imports, and the fault plan) below them all."""
