#pragma once
// CAF 0.17's deterministic test coordinator (caf/test/dsl.hpp's test_coordinator_fixture)
// under GoogleTest. Include it first, in one file per test executable: it brings the CAF test
// engine dsl.hpp refers to, without its main() (gtest_main runs the tests). dsl.hpp's own
// expect/allow/disallow report through that engine, which exists only inside CAF's runner
// (under GoogleTest they dereference a null test and crash): the tests use the fixture's
// scheduler calls and gtest's assertions instead.

// The order below matters, so clang-format leaves it alone.
// clang-format off
#define FAIL(msg) CAF_FAIL(msg)  // dsl.hpp 0.17.6 calls FAIL() without defining it
#include <caf/test/dsl.hpp>
#undef FAIL  // gtest's FAIL() from here on
#define CAF_TEST_NO_MAIN
#include <caf/test/unit_test_impl.hpp>
#include <gtest/gtest.h>
// clang-format on
