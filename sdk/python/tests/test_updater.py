"""The SDK's updater answers on CPython, against the bindings componentize-py
generates for `updater-http-plugin` (scripts/test-sdks.sh)."""

import unittest

from capstan_plugin.updater import done, failed, in_progress
from wit_world.exports import updater


class UpdaterHelpersTest(unittest.TestCase):
    def test_answers_have_the_contract_shape_with_bounds(self):
        self.assertIsInstance(done(), updater.UpdateProgress_Done)
        p = in_progress(200, 40, "half way")
        self.assertEqual((p.value.retry_after_ms, p.value.percent, p.value.message), (200, 40, "half way"))
        p = in_progress(0, 140)
        self.assertEqual((p.value.retry_after_ms, p.value.percent, p.value.message), (1, 100, None))
        self.assertIsNone(in_progress().value.percent)
        self.assertEqual(failed("no").value, "no")


if __name__ == "__main__":
    unittest.main()
