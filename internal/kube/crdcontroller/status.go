package crdcontroller

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
)

// UpdateStatus writes status (a pointer to the resource's status struct)
// into a copy of obj through the status subresource of res. It reports
// whether it wrote: a resource deleted meanwhile is not an error, as the
// next sync no longer lists it.
func UpdateStatus(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured, status any) (bool, error) {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return false, err
	}
	u := obj.DeepCopy()
	u.Object["status"] = raw
	if _, err := res.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}
