"""The addon's logic on CPython, against the bindings componentize-py
generates for `addon-plugin` (scripts/test-sdks.sh puts them and the SDK on
the path). Rendering and health through the host are checked by `capstan
plugin conformance --world addon` and the e2e tests."""

import json
import unittest

import app
from capstan_plugin.testing import captured_logs, contract_error
from wit_world.exports.addon import AddonSpec


def spec(version, config=None):
    return AddonSpec("ne", "default", version, None, json.dumps(config or {}), "v1.30.2")


class AddonTest(unittest.TestCase):
    def test_each_version_renders_its_namespace_first_and_its_own_image(self):
        with captured_logs() as logs:
            for version, _ in app.VERSIONS:
                objects = [json.loads(o) for o in app.Addon().render(spec(version, {"port": 9200}))]
                self.assertEqual(objects[0]["kind"], "Namespace")
                ds = next(o for o in objects if o["kind"] == "DaemonSet")
                container = ds["spec"]["template"]["spec"]["containers"][0]
                self.assertEqual(container["image"], f"quay.io/prometheus/node-exporter:v{version}")
                self.assertIn("--web.listen-address=:9200", container["args"])
        self.assertEqual(logs[-1], ("info", "rendered", [("version", "1.8.2"), ("objects", "4")]))

    def test_versions_list_each_channel(self):
        table = {v.version: v.channels for v in app.Addon().versions()}
        self.assertEqual(table, {"1.7.0": ["stable"], "1.8.2": ["rapid"]})

    def test_an_existing_namespace_is_rendered_into_not_created(self):
        with captured_logs():
            rendered = app.Addon().render(spec("1.7.0", {"namespace": "team-a", "createNamespace": False}))
        objects = [json.loads(o) for o in rendered]
        self.assertEqual(len(objects), 3)
        self.assertTrue(all(o["kind"] != "Namespace" and o["metadata"]["namespace"] == "team-a" for o in objects))

    def test_bad_config_and_unknown_versions_are_invalid_config_naming_the_field(self):
        addon = app.Addon()
        self.assertIn("port: 80 is not an unprivileged port", contract_error(lambda: addon.render(spec("1.7.0", {"port": 80}))))
        self.assertIn("port: expected an integer", contract_error(lambda: addon.render(spec("1.7.0", {"port": "x"}))))
        self.assertIn("unknown field", contract_error(lambda: addon.render(spec("1.7.0", {"replicas": 2}))))
        self.assertIn('version: "9.9.9" is not one of 1.7.0, 1.8.2', contract_error(lambda: addon.render(spec("9.9.9"))))

    def test_health_is_the_daemonset_rollout(self):
        ds = {"kind": "DaemonSet", "metadata": {"name": "node-exporter", "generation": 2},
              "status": {"observedGeneration": 2, "desiredNumberScheduled": 2, "numberReady": 2, "updatedNumberScheduled": 2}}
        addon = app.Addon()
        self.assertTrue(addon.assess(spec("1.7.0"), ["not json", json.dumps(ds)]).healthy)
        ds["status"]["numberReady"] = 1
        h = addon.assess(spec("1.7.0"), [json.dumps(ds)])
        self.assertFalse(h.healthy)
        self.assertIn(("numberReady", "1/2"), h.details)
        ds["status"]["observedGeneration"] = 1
        self.assertIn("not rolled out yet", addon.assess(spec("1.7.0"), [json.dumps(ds)]).message)
        self.assertEqual(addon.assess(spec("1.7.0"), []).message, "DaemonSet node-exporter is not there")


if __name__ == "__main__":
    unittest.main()
