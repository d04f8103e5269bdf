// Package tests holds fpt's integration tests: they build the real
// binaries (fpt and test_kv_app) and start clusters of separate processes
// on loopback, configured only through the ps-lite launch environment
// (DMLC_*), as a user would.
package tests
