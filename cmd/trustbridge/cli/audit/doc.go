// Package audit is trustbridge audit: the findings of a server's trust
// snapshot (/v1/snapshot), and audit log verify, which checks a hash-chained
// audit log and names a torn tail apart from an edit.
package audit
