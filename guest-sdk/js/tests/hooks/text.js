// A hook that writes its JSON itself: a string body is sent as it is.
module.exports = async function (context) {
  let parent = context.request.body.parent;
  return {
    status: 200,
    body: '{"status":{"name":"' + parent.metadata.name + '"},"children":[]}',
    headers: { 'Content-Type': 'application/json' },
  };
};
