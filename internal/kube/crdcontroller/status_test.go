package crdcontroller

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

type widgetStatus struct {
	State string `json:"state,omitempty"`
}

func TestUpdateStatus(t *testing.T) {
	obj := widget("a")
	dyn := newDynamic(obj)
	written, err := UpdateStatus(context.Background(), dyn.Resource(gvr), obj, &widgetStatus{State: "ok"})
	require.NoError(t, err)
	assert.True(t, written)
	got, err := dyn.Resource(gvr).Get(context.Background(), "a", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"state": "ok"}, got.Object["status"])
	assert.NotContains(t, obj.Object, "status", "the caller's object is not changed")
}

func TestUpdateStatusFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		wantErr string
	}{
		{"deleted meanwhile", apierrors.NewNotFound(gvr.GroupResource(), "a"), ""},
		{"refused", errors.New("etcd is down"), "etcd is down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := widget("a")
			dyn := newDynamic(obj)
			dyn.PrependReactor("update", "widgets", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			written, err := UpdateStatus(context.Background(), dyn.Resource(gvr), obj, &widgetStatus{State: "ok"})
			assert.False(t, written)
			if tc.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
}
