"""`easd-local pair score`: know a draft/target pair without generating. Both models run
teacher-forced over the same texts (``passes``), and from their logits at every position
come the acceptance rate α, the greedy agreement, KL, entropies, the EASD gate's fire rate
and, from an exact simulation of greedy SD along the text and the i.i.d. formula for
sampled SD, the predicted tokens per verify by gamma (``predict``); a timing probe turns them
into a predicted speed-up (``probe``). ``corpus`` reads the texts, ``summary`` assembles what
the command reports."""
