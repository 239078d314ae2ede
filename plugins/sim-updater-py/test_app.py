"""The updater's logic on CPython, against the bindings componentize-py
generates for `updater-http-plugin` (scripts/test-sdks.sh puts them and the
SDK on the path). The HTTP calls are exercised against the sim cloud by
`capstan plugin conformance --world updater` and the e2e tests."""

import unittest

import app
from capstan_plugin.testing import contract_error
from wit_world.exports import updater
from wit_world.imports.capstan_plugin_types import Machine


def machine(version, provider_id="sim://i-1", config='{"endpoint": "http://127.0.0.1:1"}'):
    return Machine("m", "default", "uid-1", None, [], version, None, config, None, provider_id)


class UpdaterTest(unittest.TestCase):
    def test_claims_only_the_version(self):
        u = app.Updater()
        self.assertEqual(u.can_update(machine("v1"), machine("v2"), ["labels", "version", "instanceType"]), ["version"])
        self.assertEqual(u.can_update(machine("v1"), machine("v1"), ["labels"]), [])

    def test_progress_is_read_from_the_instance(self):
        self.assertIsInstance(app.progress({"state": "running", "version": "v2"}, "v2"), updater.UpdateProgress_Done)
        p = app.progress({"state": "updating", "version": "v1", "update": {"targetVersion": "v2", "percent": 40}}, "v2")
        self.assertIsInstance(p, updater.UpdateProgress_InProgress)
        self.assertEqual((p.value.percent, p.value.message), (40, "updating to v2"))
        self.assertEqual(app.progress({"state": "terminating"}, "v2").value, "the instance is being deleted")
        # Not there yet, or another update under way: start ours.
        self.assertIsNone(app.progress({"state": "running", "version": "v1"}, "v2"))
        self.assertIsNone(app.progress({"state": "running", "update": {"targetVersion": "v3", "percent": 1}}, "v2"))

    def test_nothing_claimed_is_done_without_a_request(self):
        self.assertIsInstance(app.Updater().update(machine("v1"), machine("v2"), []), updater.UpdateProgress_Done)

    def test_bad_input_is_a_contract_error_naming_what(self):
        u = app.Updater()
        self.assertIn("version: the desired machine has no version", contract_error(lambda: u.update(machine("v1"), machine(None), ["version"])))
        self.assertIn("endpoint: expected a string", contract_error(lambda: u.update(machine("v1"), machine("v2", config='{"endpoint": 1}'), ["version"])))
        self.assertTrue(contract_error(lambda: u.update(machine("v1", provider_id=None), machine("v2"), ["version"])).startswith("Terminal"))
        self.assertTrue(contract_error(lambda: app.instance_id("aws:///i-1")).startswith("Terminal"))


if __name__ == "__main__":
    unittest.main()
