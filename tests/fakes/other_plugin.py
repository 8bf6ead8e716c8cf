"""Another runtime-env plugin, registered beside ours on a test node."""

from ray._private.runtime_env.plugin import RuntimeEnvPlugin


class OtherPlugin(RuntimeEnvPlugin):
    name = "other_plugin"

    def modify_context(self, uris, runtime_env, context, logger):
        context.env_vars["OTHER_PLUGIN_SAW"] = str(runtime_env.get(self.name))
