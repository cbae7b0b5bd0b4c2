-- Set one limit held in the store: $1 the layer, $2 the scope, $3 the value.
INSERT INTO {limits} (layer, scope, value) VALUES ($1, $2, $3)
ON CONFLICT (layer, scope) DO UPDATE SET value = excluded.value
