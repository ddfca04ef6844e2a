package upstream_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/ca/upstream"
)

type ownRefusal struct{ refused bool }

func (e ownRefusal) Error() string         { return "own" }
func (e ownRefusal) UpstreamRefused() bool { return e.refused }

func TestRefused(t *testing.T) {
	denied := errors.New("permission denied")
	marked := upstream.Refused(denied)
	assert.EqualError(t, marked, "permission denied", "the text is the error's")
	assert.ErrorIs(t, marked, denied)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"marked", marked, true},
		{"marked, wrapped", fmt.Errorf("ca: upstream x: %w", marked), true},
		{"joined", errors.Join(errors.New("other"), marked), true},
		{"implementation's own", fmt.Errorf("x: %w", ownRefusal{refused: true}), true},
		{"implementation's own, saying no", ownRefusal{}, false},
		{"unmarked", denied, false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, upstream.IsRefused(tc.err))
		})
	}
	assert.NoError(t, upstream.Refused(nil))
}
