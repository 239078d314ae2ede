"""The provider's logic on CPython, against the bindings componentize-py
generates for `provider-http-plugin` (scripts/test-sdks.sh puts them and the
SDK on the path). The HTTP calls themselves are exercised against the sim
cloud by `capstan plugin conformance` and the e2e tests."""

import unittest

import app
from capstan_plugin.testing import contract_error


class ProviderTest(unittest.TestCase):
    def test_config_errors_name_the_field(self):
        p = app.Provider()
        p.validate('{"endpoint": "http://127.0.0.1:1", "instanceType": "small"}')
        self.assertIn("endpoint: `127.0.0.1:1` must be", contract_error(lambda: p.validate('{"endpoint": "127.0.0.1:1"}')))
        self.assertIn("instanceType: `huge` is not one of", contract_error(lambda: p.validate('{"endpoint": "http://x", "instanceType": "huge"}')))
        self.assertIn("tags: `capstan.dev/x` is reserved", contract_error(lambda: p.validate('{"endpoint": "http://x", "tags": {"capstan.dev/x": "y"}}')))
        self.assertIn("unknown field", contract_error(lambda: p.validate('{"endpoint": "http://x", "zone": "a"}')))

    def test_provider_ids_round_trip_and_foreign_ones_are_refused(self):
        self.assertEqual(app.instance_id("sim://i-000001"), "i-000001")
        for bad in ("aws:///us-east-1/i-1", "sim://", "sim://../admin"):
            self.assertTrue(contract_error(lambda: app.instance_id(bad)).startswith("Terminal"), bad)

    def test_an_instance_maps_to_a_machine_status(self):
        s = app.status({"id": "i-7", "state": "running", "privateIp": "10.0.0.7", "version": "v1.30.0",
                        "update": {"targetVersion": "v1.31.0", "percent": 40}})
        self.assertEqual(s.provider_id, "sim://i-7")
        self.assertEqual(s.state, app.types.InstanceState.RUNNING)
        self.assertEqual(s.addresses[0].address, "10.0.0.7")
        self.assertEqual(s.message, "updating to v1.31.0 (40%)")
        self.assertEqual(app.status({"id": "i-8", "state": "weird"}).state, app.types.InstanceState.UNKNOWN)


if __name__ == "__main__":
    unittest.main()
