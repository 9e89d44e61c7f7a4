// Package codestyle holds tests that keep the house rules of
// docs/architecture.md ("Rules of the code") checkable: today, that no
// function is longer than about 80 lines unless its doc comment says why.
// It has no code of its own.
package codestyle
