// Package policy is trustbridge policy: explain, which shows what one
// workload would receive of each trust domain and which rule decided, and
// check, which loads a trust policy file as the server would.
package policy
