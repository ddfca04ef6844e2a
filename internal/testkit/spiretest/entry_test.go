package spiretest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseEntryCreate(t *testing.T) {
	for _, tc := range []struct {
		name, out, id, err string
	}{
		{"created", `{"results":[{"status":{"code":0,"message":"OK"},"entry":{"id":"e1"}}]}`, "e1", ""},
		{"refused", `{"results":[{"status":{"code":6,"message":"similar entry already exists"},"entry":{}}]}`, "", `status 6 "similar entry already exists"`},
		{"no result", `{"results":[]}`, "", "0 results"},
		{"not json", `Entry ID: e1`, "", "entry create output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := parseEntryCreate(tc.out)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.id, id)
		})
	}
}
