"""What makes a stage stale: the config keys that change its result (:mod:`.keys`) and the
code that decides it (:mod:`.code`). Both reach the rules as params; infrastructure, so an
edit here re-runs nothing by itself."""
