"""Hidden states made on demand inside training (``extract.mode`` online and hybrid): no
extract job, each train job extracts for itself (docs/train.md, "Hidden states without the
disk").

- :mod:`.job`: the train job's side: its hidden states' record, the hybrid cache, the disk
  check, the servers started before each launch of the training process, the checks after;
- :mod:`.servers`: the extraction servers: their layers, GPUs, start and stop, or those of
  ``extract.endpoints``;
- :mod:`.spec`: what the train job tells the training process (the spec) and what it hears
  back (the ledger of the samples served);
- :mod:`.transfer`: the training process's side: the hidden-states backend that asks a server
  for each sample and checks it as the extract job does.
"""
