"""Where gpudoctor meets the tools people train with: the notebook magic (``notebook``); each module imports
its framework only when used, so none is a dependency of gpudoctor."""
