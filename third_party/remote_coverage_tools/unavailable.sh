#!/bin/sh
echo "remote_coverage_tools: not available in the offline build (bazel coverage is unsupported)" >&2
exit 1
