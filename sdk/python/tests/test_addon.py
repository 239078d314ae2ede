"""The SDK's addon helpers on CPython, against the bindings componentize-py
generates for `addon-plugin` (scripts/test-sdks.sh)."""

import json
import unittest

from capstan_plugin.addon import daemonset_health, deployment_health, find_observed, pick_version, version_table
from capstan_plugin.testing import contract_error
from wit_world.exports.addon import AddonSpec

TABLE = [("1.0.0", "stable"), ("1.1.0", "rapid"), ("1.0.0", "lts")]


class AddonHelpersTest(unittest.TestCase):
    def test_version_table_groups_channels_in_first_seen_order(self):
        got = [(v.version, v.channels) for v in version_table(TABLE)]
        self.assertEqual(got, [("1.0.0", ["stable", "lts"]), ("1.1.0", ["rapid"])])
        ranged = version_table(TABLE, {"1.1.0": ">=1.20.0"})
        self.assertEqual([v.kubernetes for v in ranged], [None, ">=1.20.0"])

    def test_pick_version_names_the_known_ones(self):
        spec = AddonSpec("a", "default", "1.1.0", None, "{}", "v1.30.2")
        self.assertEqual(pick_version(spec, TABLE), "1.1.0")
        spec.version = None
        self.assertEqual(contract_error(lambda: pick_version(spec, TABLE)), 'InvalidConfig: version: "" is not one of 1.0.0, 1.1.0')

    def test_find_observed_skips_other_objects_and_text_that_is_not_json(self):
        observed = ["{", json.dumps({"kind": "Service", "metadata": {"name": "x"}}), json.dumps({"kind": "Deployment", "metadata": {"name": "x"}})]
        self.assertEqual(find_observed(observed, "Deployment", "x")["kind"], "Deployment")
        self.assertIsNone(find_observed(observed, "Deployment", "y"))

    def test_deployment_health_needs_the_rollout_and_every_replica(self):
        d = {"metadata": {"generation": 3}, "spec": {"replicas": 2},
             "status": {"observedGeneration": 3, "updatedReplicas": 2, "availableReplicas": 2}}
        h = deployment_health(d, "dns")
        self.assertTrue(h.healthy)
        self.assertEqual(h.details, [("availableReplicas", "2/2"), ("updatedReplicas", "2/2")])
        d["status"]["availableReplicas"] = 1
        self.assertEqual(deployment_health(d, "dns").message, "Deployment dns: 2/2 updated, 1/2 available")
        d["status"]["observedGeneration"] = 2
        self.assertFalse(deployment_health(d, "dns").healthy)
        self.assertFalse(deployment_health(None, "dns").healthy)
        # No replicas field means one, as Kubernetes defaults it.
        self.assertTrue(deployment_health({"status": {"updatedReplicas": 1, "availableReplicas": 1}}, "dns").healthy)

    def test_daemonset_health_counts_scheduled_ready_and_updated(self):
        ds = {"status": {"desiredNumberScheduled": 3, "numberReady": 3, "updatedNumberScheduled": 2}}
        h = daemonset_health(ds, "ne")
        self.assertFalse(h.healthy)
        self.assertEqual(h.message, "DaemonSet ne: 3/3 ready, 2/3 updated")
        ds["status"]["updatedNumberScheduled"] = 3
        self.assertTrue(daemonset_health(ds, "ne").healthy)
        # A boolean is not a count.
        ds["status"]["numberReady"] = True
        self.assertFalse(daemonset_health(ds, "ne").healthy)


if __name__ == "__main__":
    unittest.main()
