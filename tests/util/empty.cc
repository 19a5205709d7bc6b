// Keeps the test-util library non-empty.
