"""Where gpudoctor meets the tools people train with: the notebook magic (``notebook``), the trainer callbacks
(``transformers``, ``lightning``); each module imports
its framework only when used, so none is a dependency of gpudoctor."""
