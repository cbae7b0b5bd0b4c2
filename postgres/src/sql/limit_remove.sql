-- Remove one limit held in the store: $1 the layer, $2 the scope.
DELETE FROM {limits} WHERE layer = $1 AND scope = $2
